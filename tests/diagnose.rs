//! Misconfigurations that say so (issue 21): the plugin shows which clusters it steers.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

mod store;

use ewma_lb::worker::Worker;
use store::config;

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_status_document_lists_the_steered_clusters_as_configured() {
    let cases: [(&str, &[&str]); 3] = [
        ("{}", &["*"]),
        (
            r#"{"steered_clusters": ["backend", "outbound|9080||*", "backend"]}"#,
            &["backend", "outbound|9080||*"],
        ),
        (r#"{"steered_clusters": []}"#, &[]),
    ];
    for (cfg, want) in cases {
        let w = Worker::new(config(cfg), 1);
        let status: serde_json::Value = serde_json::from_str(&w.status_json()).unwrap();
        assert_eq!(
            status["steered_clusters"],
            serde_json::json!(want),
            "{cfg}: {status}"
        );
        assert_eq!(w.config().steered_clusters(), want);
    }
}
