//! The wasm HTTP filter: the plugin's configuration (JSON text in a `StringValue`, as the plugin
//! reads it) and the module file.

use std::path::Path;

use anyhow::{anyhow, Result};
use serde_json::Value;

use super::node::view;

/// The HTTP filter's name.
pub const WASM_FILTER: &str = "envoy.filters.http.wasm";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const STRING_VALUE_TYPE: &str = "type.googleapis.com/google.protobuf.StringValue";
const CONFIGURATION: &str = "typed_config.config.configuration";
const MODULE_FILE: &str = "typed_config.config.vm_config.code.local.filename";

view!(
    /// An item of `http_filters` named `envoy.filters.http.wasm`.
    WasmFilter
);

impl WasmFilter<'_> {
    /// The plugin configuration's JSON text, as the plugin receives it.
    pub fn plugin_config(&self) -> Result<&str> {
        self.check_string_value()?;
        self.get_str(&format!("{CONFIGURATION}.value"))
    }

    /// Replaces the plugin configuration with `json` (passed byte for byte: an invalid one is how
    /// a test makes Envoy refuse to start).
    pub fn set_plugin_config(&mut self, json: &str) -> Result<&mut Self> {
        self.check_string_value()?;
        self.set(&format!("{CONFIGURATION}.value"), json)?;
        Ok(self)
    }

    /// The module's local file name.
    pub fn module_file(&self) -> Result<&str> {
        self.get_str(MODULE_FILE)
    }

    pub fn set_module_file(&mut self, file: &Path) -> Result<&mut Self> {
        let text = file
            .to_str()
            .ok_or_else(|| anyhow!("module path {} is not UTF-8", file.display()))?;
        self.set(MODULE_FILE, text)?;
        Ok(self)
    }

    /// The plugin reads its configuration as JSON text: a `Struct` would reach it as protobuf.
    fn check_string_value(&self) -> Result<()> {
        let at = format!("{CONFIGURATION}.@type");
        match self.get_str(&at)? {
            STRING_VALUE_TYPE => Ok(()),
            other => Err(self.error(&at, format!("expected {STRING_VALUE_TYPE}, found {other}"))),
        }
    }
}

/// Makes every relative module file of every wasm filter under `root` relative to `base`
/// instead (Envoy reads them relative to its working directory); returns how many it changed.
pub fn resolve_module_paths(root: &mut Value, base: &Path) -> usize {
    match root {
        Value::Object(map) => {
            let mut changed = 0;
            if map.get("@type").and_then(Value::as_str) == Some(WASM_TYPE) {
                if let Some(Value::String(file)) = map
                    .get_mut("config")
                    .and_then(|c| c.pointer_mut("/vm_config/code/local/filename"))
                {
                    if Path::new(file.as_str()).is_relative() {
                        *file = base.join(&*file).to_string_lossy().into_owned();
                        changed += 1;
                    }
                }
            }
            changed
                + map
                    .values_mut()
                    .map(|v| resolve_module_paths(v, base))
                    .sum::<usize>()
        }
        Value::Array(items) => items
            .iter_mut()
            .map(|v| resolve_module_paths(v, base))
            .sum(),
        _ => 0,
    }
}
