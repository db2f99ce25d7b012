//! A no-op proxy-wasm HTTP filter: it has an HTTP context for every request, as ewma-lb does,
//! and lets every callback continue untouched.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot) });
}}

struct NoopRoot;

impl Context for NoopRoot {}

impl RootContext for NoopRoot {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(NoopHttp))
    }
}

struct NoopHttp;

impl Context for NoopHttp {}

impl HttpContext for NoopHttp {}
