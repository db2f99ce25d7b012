//! The mechanism without the balancer: every request gets the override header (`x-ewma-lb-host`,
//! what the shipped cluster's `override_host` reads) naming the next endpoint of a fixed list, and
//! on_log reads `upstream.address`, as ewma-lb does to learn who served. No EWMA, no shared data,
//! no timer. The list is the plugin configuration, a comma-separated `ip:port` string, parsed
//! once at configure time (no JSON reader: the module stays as small as the no-op one).

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

const OVERRIDE_HEADER: &str = "x-ewma-lb-host";

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(HeaderRoot { hosts: Rc::new(Vec::new()), next: Rc::new(Cell::new(0)) })
    });
}}

struct HeaderRoot {
    hosts: Rc<Vec<Vec<u8>>>,
    /// Shared by the VM's requests: round robin over `hosts`.
    next: Rc<Cell<usize>>,
}

impl Context for HeaderRoot {}

impl RootContext for HeaderRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let hosts: Vec<Vec<u8>> = config
            .split(|&b| b == b',')
            .map(|h| h.trim_ascii().to_vec())
            .filter(|h| !h.is_empty())
            .collect();
        // Without endpoints the module would measure nothing it claims to: refuse to start.
        if hosts.is_empty() {
            return false;
        }
        self.hosts = Rc::new(hosts);
        true
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(HeaderHttp {
            hosts: Rc::clone(&self.hosts),
            next: Rc::clone(&self.next),
        }))
    }
}

struct HeaderHttp {
    hosts: Rc<Vec<Vec<u8>>>,
    next: Rc<Cell<usize>>,
}

impl Context for HeaderHttp {}

impl HttpContext for HeaderHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let i = self.next.get();
        self.next.set(i.wrapping_add(1));
        if let Some(host) = self.hosts.get(i % self.hosts.len().max(1)) {
            self.set_http_request_header_bytes(OVERRIDE_HEADER, Some(host));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        std::hint::black_box(self.get_property(vec!["upstream", "address"]));
    }
}
