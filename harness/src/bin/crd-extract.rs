//! Writes the structural extract of the full CRDs (tests/crds/, see `harness::crds`).
//!
//!   cargo run -p ewma-harness --bin crd-extract -- FULL_CRDS_DIR [OUT_DIR]
//!
//! OUT_DIR defaults to tests/crds of this repository. Every `*.yaml` of FULL_CRDS_DIR gives one
//! `*.json`; extracts without a source are removed, so the folder mirrors the source set.

use anyhow::{bail, Context, Result};
use harness::crds;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(source) = args.first() else {
        bail!("usage: crd-extract FULL_CRDS_DIR [OUT_DIR]")
    };
    let out = args
        .get(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| harness::repo_root().join("tests/crds"));
    std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    let mut written = Vec::new();
    for entry in std::fs::read_dir(source).with_context(|| source.clone())? {
        let path = entry?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.ends_with(".yaml"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        let extract = crds::extract(&path.display().to_string(), &text)?;
        let target = out.join(crds::extract_name(name));
        std::fs::write(&target, crds::render(&extract))
            .with_context(|| target.display().to_string())?;
        println!("{} -> {}", path.display(), target.display());
        written.push(crds::extract_name(name));
    }
    for entry in std::fs::read_dir(&out)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.ends_with(".json") && !written.contains(&name) {
            std::fs::remove_file(&path)?;
            println!("removed {} (no source)", path.display());
        }
    }
    Ok(())
}
