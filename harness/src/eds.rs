//! Endpoints from a file Envoy watches (EDS without a control plane): the cluster reads its
//! `ClusterLoadAssignment` from a file (`eds_cluster_config` with a `path_config_source`), and
//! Envoy reloads it whenever a new version is moved into the watched directory. Tests and the
//! benchmark add, remove and replace endpoints under load this way, and give each endpoint a zone
//! (its locality group), as a Kubernetes control plane would.
//!
//! Every version is written beside the watched directory and then renamed into it, so Envoy
//! never reads half a file.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// `type.googleapis.com/...` of the resource in the file.
const LOAD_ASSIGNMENT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// One endpoint of a cluster: its address and, optionally, its zone (`locality.zone`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub zone: Option<String>,
}

impl Endpoint {
    pub fn new(addr: SocketAddr, zone: Option<&str>) -> Endpoint {
        Endpoint {
            addr,
            zone: zone.map(str::to_string),
        }
    }
}

/// The `ClusterLoadAssignment` of `endpoints`: one locality group per zone (endpoints without a
/// zone in a group without a locality), groups in the order their zones first appear.
pub fn load_assignment(cluster: &str, endpoints: &[Endpoint]) -> Value {
    let mut zones: Vec<Option<&str>> = Vec::new();
    for e in endpoints {
        if !zones.contains(&e.zone.as_deref()) {
            zones.push(e.zone.as_deref());
        }
    }
    let groups: Vec<Value> = zones
        .into_iter()
        .map(|zone| {
            let members: Vec<Value> = endpoints
                .iter()
                .filter(|e| e.zone.as_deref() == zone)
                .map(|e| json!({"endpoint": {"address": {"socket_address": {"address": e.addr.ip().to_string(), "port_value": e.addr.port()}}}}))
                .collect();
            let mut group = json!({ "lb_endpoints": members });
            if let Some(zone) = zone {
                group["locality"] = json!({ "zone": zone });
            }
            group
        })
        .collect();
    json!({ "cluster_name": cluster, "endpoints": groups })
}

/// A cluster's endpoints in a file Envoy watches. Dropping it removes the files.
#[derive(Debug)]
pub struct EdsFile {
    /// Holds `watched/` and the versions being written.
    base: PathBuf,
    cluster: String,
    endpoints: Vec<Endpoint>,
    versions: u64,
}

impl EdsFile {
    /// A fresh directory with the first version of `cluster`'s endpoints in it (Envoy needs the
    /// file when it starts: the cluster waits for its first load assignment).
    pub fn create(cluster: &str, endpoints: Vec<Endpoint>) -> Result<EdsFile> {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir().join(format!(
            "ewma-eds-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(base.join("watched"))
            .with_context(|| format!("creating {}", base.display()))?;
        let mut file = EdsFile {
            base,
            cluster: cluster.to_string(),
            endpoints: Vec::new(),
            versions: 0,
        };
        file.set(endpoints)?;
        Ok(file)
    }

    /// The file the cluster's `path_config_source` names.
    pub fn path(&self) -> PathBuf {
        self.watched_dir().join(format!("{}.json", self.cluster))
    }

    /// The directory Envoy watches for the file's new versions.
    pub fn watched_dir(&self) -> PathBuf {
        self.base.join("watched")
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The endpoints of the last version written.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Writes a new version with these endpoints, atomically.
    pub fn set(&mut self, endpoints: Vec<Endpoint>) -> Result<()> {
        self.versions += 1;
        let mut resource = load_assignment(&self.cluster, &endpoints);
        resource["@type"] = json!(LOAD_ASSIGNMENT_TYPE);
        let body = json!({ "version_info": self.versions.to_string(), "resources": [resource] });
        let next = self
            .base
            .join(format!("{}.{}.json", self.cluster, self.versions));
        fs::write(&next, serde_json::to_vec_pretty(&body)?)
            .with_context(|| format!("writing {}", next.display()))?;
        fs::rename(&next, self.path())
            .with_context(|| format!("moving {} to {}", next.display(), self.path().display()))?;
        self.endpoints = endpoints;
        Ok(())
    }

    /// Adds endpoints (a scale-out, new pods).
    pub fn add(&mut self, more: impl IntoIterator<Item = Endpoint>) -> Result<()> {
        let mut all = self.endpoints.clone();
        all.extend(more);
        self.set(all)
    }

    /// Removes the endpoints at these addresses (a scale-in, pods gone).
    pub fn remove(&mut self, addrs: &[SocketAddr]) -> Result<()> {
        let left = self
            .endpoints
            .iter()
            .filter(|e| !addrs.contains(&e.addr))
            .cloned()
            .collect();
        self.set(left)
    }

    /// The base directory, for error messages.
    pub fn base(&self) -> &Path {
        &self.base
    }
}

impl Drop for EdsFile {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_locality_group_per_zone() {
        let e = |port: u16, zone: Option<&str>| {
            Endpoint::new(SocketAddr::from(([127, 0, 0, 1], port)), zone)
        };
        let cla = load_assignment(
            "backend",
            &[
                e(1, Some("a")),
                e(2, Some("b")),
                e(3, Some("a")),
                e(4, None),
            ],
        );
        let groups = cla["endpoints"].as_array().unwrap();
        assert_eq!(groups.len(), 3);
        assert_eq!(groups[0]["locality"]["zone"], "a");
        assert_eq!(groups[0]["lb_endpoints"].as_array().unwrap().len(), 2);
        assert_eq!(
            groups[1]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"],
            2
        );
        assert!(groups[2].get("locality").is_none());
    }

    #[test]
    fn versions_replace_the_file_whole() {
        let addr = |port: u16| Endpoint::new(SocketAddr::from(([127, 0, 0, 1], port)), None);
        let mut f = EdsFile::create("backend", vec![addr(1)]).unwrap();
        f.add([addr(2), addr(3)]).unwrap();
        f.remove(&[addr(1).addr]).unwrap();
        let v: Value = serde_json::from_slice(&fs::read(f.path()).unwrap()).unwrap();
        assert_eq!(v["version_info"], "3");
        assert_eq!(v["resources"][0]["@type"], LOAD_ASSIGNMENT_TYPE);
        assert_eq!(
            v["resources"][0]["endpoints"][0]["lb_endpoints"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        // Only the current version is left behind: every other was renamed into place.
        assert_eq!(fs::read_dir(f.base()).unwrap().count(), 1, "just watched/");
        let base = f.base().to_path_buf();
        drop(f);
        assert!(!base.exists());
    }
}
