//! A proxy-wasm HTTP filter that fails its VM on request: a request for `/panic` panics (with
//! `panic = "abort"`, a trap Envoy sees as the VM failing); every other request continues.

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
        if self.get_http_request_header(":path").as_deref() == Some("/panic") {
            panic!("panic-on-path: asked to fail");
        }
        Action::Continue
    }
}
