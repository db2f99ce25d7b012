//! A proxy-wasm HTTP filter that misbehaves on request: a request for `/panic` panics (with
//! `panic = "abort"`, a trap Envoy sees as the VM failing); one for `/hold` keeps the worker
//! busy for 6 s, as work that grows with a hostile input would; every other request continues.

use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http))
    }
}

struct Http;

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        match self.get_http_request_header(":path").as_deref() {
            Some("/panic") => panic!("panic-on-path: asked to fail"),
            Some("/hold") => {
                let start = self.get_current_time();
                while self
                    .get_current_time()
                    .duration_since(start)
                    .is_ok_and(|d| d < Duration::from_secs(6))
                {}
                Action::Continue
            }
            _ => Action::Continue,
        }
    }
}
