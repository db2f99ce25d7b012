//! What one VM keeps, shared by its root context and its request contexts (one thread, so
//! `Rc<RefCell>`).

use super::metrics::Metrics;
use crate::balance::score::LoadReportWatch;
use crate::map::Map;
use crate::worker::Worker;

pub struct Vm {
    pub worker: Worker,
    pub metrics: Metrics,
    /// Reused for every override header value, so a steered request allocates none.
    pub header_value: String,
    /// Reused for every request's decision property (`wasm.ewma_lb_decision`).
    pub decision_value: String,
    /// Per cluster: whether its responses carry load reports, so the header is read only where
    /// they do.
    pub load_reports: Map<String, LoadReportWatch>,
    /// A request asked for a tick at once (`Worker::take_tick_wanted`): the tick period is the
    /// host's shortest until that tick sets it back.
    pub tick_soon: bool,
}

impl Vm {
    pub fn new(worker: Worker) -> Self {
        Vm {
            worker,
            metrics: Metrics::default(),
            header_value: String::new(),
            decision_value: String::new(),
            load_reports: Map::default(),
            tick_soon: false,
        }
    }
}
