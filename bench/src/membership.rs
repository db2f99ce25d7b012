//! Clusters that change during a run: which endpoints are in the cluster when, and in which zone.
//!
//! A scenario's backends all start before the first policy runs; a backend with `join` enters
//! the cluster at that second of each run, one with `leave` goes at that second (it keeps
//! running, as a pod that drains does, and Envoy lets go of it). Zones (`zone`, and the proxy's
//! own `local_zone`) become EDS localities and the bootstrap's `node.locality`. A scenario with
//! none of these keeps its endpoints in the config as before; one with any of them has them in a
//! file Envoy watches (`harness::eds`), rewritten at each change while the load runs.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde::Deserialize;

use harness::config::CLUSTER;
use harness::latency::parse_duration;
use harness::{Backend, EdsFile, Endpoint, EnvoyConfig};

/// A `[[backend]]`'s membership keys, as the scenario file has them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMembership {
    /// `locality.zone` of the endpoint.
    pub zone: Option<String>,
    /// Second of each run at which it joins the cluster (default: in it from the start).
    pub join: Option<String>,
    /// Second of each run at which it leaves the cluster (default: never).
    pub leave: Option<String>,
    /// With `count`: the i-th copy joins and leaves `i × stagger` later (a rolling restart).
    pub stagger: Option<String>,
}

/// When one endpoint is in the cluster, and where.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointPlan {
    pub zone: Option<String>,
    pub join_s: f64,
    pub leave_s: Option<f64>,
}

impl EndpointPlan {
    /// The plan of copy `index` of a backend entry.
    pub fn parse(file: &FileMembership, index: usize) -> Result<EndpointPlan> {
        let secs = |s: &Option<String>, what: &str| -> Result<Option<f64>> {
            s.as_deref()
                .map(|v| {
                    parse_duration(v)
                        .map(|d| d.as_secs_f64())
                        .map_err(|e| anyhow!("{what}: {e:#}"))
                })
                .transpose()
        };
        let offset = secs(&file.stagger, "stagger")?.unwrap_or(0.0) * index as f64;
        let join_s = secs(&file.join, "join")?.map_or(0.0, |j| j + offset);
        let leave_s = secs(&file.leave, "leave")?.map(|l| l + offset);
        if leave_s.is_some_and(|l| l <= join_s) {
            return Err(anyhow!(
                "leave ({leave_s:?} s) must come after join ({join_s} s)"
            ));
        }
        Ok(EndpointPlan {
            zone: file.zone.clone(),
            join_s,
            leave_s,
        })
    }

    /// Whether the endpoint is in the cluster at second `t` of a run.
    pub fn member_at(&self, t: f64) -> bool {
        t >= self.join_s && self.leave_s.is_none_or(|l| t < l)
    }

    /// Whether it is in the cluster during the whole of `[from, to)`.
    pub fn member_throughout(&self, from: f64, to: f64) -> bool {
        self.join_s <= from && self.leave_s.is_none_or(|l| l >= to)
    }
}

/// Who is in the cluster when, for every backend of a scenario (same order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Membership {
    /// The proxy's zone (bootstrap `node.locality.zone`).
    pub local_zone: Option<String>,
    pub endpoints: Vec<EndpointPlan>,
}

impl Membership {
    /// Endpoints fixed for the whole run and no zones: the config can list them, as before.
    pub fn is_static(&self) -> bool {
        self.local_zone.is_none()
            && self
                .endpoints
                .iter()
                .all(|e| e.zone.is_none() && e.join_s == 0.0 && e.leave_s.is_none())
    }

    /// The backends (by index) in the cluster at second `t`.
    pub fn members_at(&self, t: f64) -> Vec<usize> {
        (0..self.endpoints.len())
            .filter(|i| self.endpoints[*i].member_at(t))
            .collect()
    }

    /// The seconds after 0 at which the membership changes, in order.
    pub fn change_times(&self) -> Vec<f64> {
        let mut times: Vec<f64> = self
            .endpoints
            .iter()
            .flat_map(|e| [Some(e.join_s), e.leave_s])
            .flatten()
            .filter(|t| *t > 0.0)
            .collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        times
    }

    pub fn validate(&self, duration: Duration) -> Result<()> {
        if self.members_at(0.0).is_empty() {
            return Err(anyhow!(
                "no backend is in the cluster at the start (every one has a later `join`)"
            ));
        }
        if let Some(t) = self
            .change_times()
            .into_iter()
            .find(|t| self.members_at(*t).is_empty())
        {
            return Err(anyhow!("at {t} s every backend has left the cluster"));
        }
        if let Some(t) = self
            .change_times()
            .into_iter()
            .find(|t| *t >= duration.as_secs_f64())
        {
            return Err(anyhow!(
                "a backend joins or leaves at {t} s, after the run ({duration:?})"
            ));
        }
        Ok(())
    }
}

/// A run's cluster changes in motion: the EDS file Envoy reads and the thread that rewrites it.
pub struct Churn {
    membership: Membership,
    addrs: Vec<std::net::SocketAddr>,
    eds: EdsFile,
}

impl Churn {
    /// For a scenario whose membership is not static: points `config`'s cluster at a fresh EDS
    /// file with the endpoints of second 0, and the node at the local zone. `None` (and the
    /// config untouched) for a static one.
    pub fn prepare(
        membership: &Membership,
        config: &mut EnvoyConfig,
        backends: &[Backend],
    ) -> Result<Option<Churn>> {
        if membership.is_static() {
            return Ok(None);
        }
        let addrs: Vec<_> = backends.iter().map(Backend::addr).collect();
        let eds = EdsFile::create(CLUSTER, endpoints_at(membership, &addrs, 0.0))?;
        config.use_eds_file(CLUSTER, &eds)?;
        if let Some(zone) = &membership.local_zone {
            config.set_node_zone(zone)?;
        }
        Ok(Some(Churn {
            membership: membership.clone(),
            addrs,
            eds,
        }))
    }

    /// Applies each change before `until` at its second, counted from now (call it as the load
    /// starts); join the handle once the load is over.
    pub fn start(self, until: Duration) -> JoinHandle<Result<Churn>> {
        let start = Instant::now();
        std::thread::spawn(move || {
            let mut churn = self;
            for t in churn
                .membership
                .change_times()
                .into_iter()
                .filter(|t| *t < until.as_secs_f64())
            {
                std::thread::sleep(
                    (start + Duration::from_secs_f64(t)).saturating_duration_since(Instant::now()),
                );
                let endpoints = endpoints_at(&churn.membership, &churn.addrs, t);
                churn.eds.set(endpoints)?;
            }
            Ok(churn)
        })
    }
}

fn endpoints_at(membership: &Membership, addrs: &[std::net::SocketAddr], t: f64) -> Vec<Endpoint> {
    membership
        .members_at(t)
        .into_iter()
        .filter_map(|i| {
            Some(Endpoint::new(
                *addrs.get(i)?,
                membership.endpoints.get(i)?.zone.as_deref(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(
        join: Option<&str>,
        leave: Option<&str>,
        stagger: Option<&str>,
        i: usize,
    ) -> Result<EndpointPlan> {
        let f = FileMembership {
            zone: None,
            join: join.map(Into::into),
            leave: leave.map(Into::into),
            stagger: stagger.map(Into::into),
        };
        EndpointPlan::parse(&f, i)
    }

    #[test]
    fn plans_stagger_copies_and_refuse_a_leave_before_the_join() {
        assert_eq!(
            plan(Some("10s"), Some("20s"), Some("1.5s"), 2).unwrap(),
            EndpointPlan {
                zone: None,
                join_s: 13.0,
                leave_s: Some(23.0)
            }
        );
        assert_eq!(plan(None, None, None, 7).unwrap(), EndpointPlan::default());
        assert!(plan(Some("10s"), Some("5s"), None, 0).is_err());
        assert!(plan(Some("soon"), None, None, 0).is_err());
    }

    #[test]
    fn membership_over_time() {
        let m = Membership {
            local_zone: None,
            endpoints: vec![
                EndpointPlan::default(),
                EndpointPlan {
                    join_s: 0.0,
                    leave_s: Some(10.0),
                    zone: None,
                },
                EndpointPlan {
                    join_s: 10.0,
                    leave_s: None,
                    zone: None,
                },
            ],
        };
        assert!(!m.is_static());
        assert_eq!(m.members_at(0.0), vec![0, 1]);
        assert_eq!(m.members_at(10.0), vec![0, 2]);
        assert_eq!(m.change_times(), vec![10.0]);
        assert!(m.validate(Duration::from_secs(20)).is_ok());
        assert!(
            m.validate(Duration::from_secs(10)).is_err(),
            "a change at the end of the run"
        );
        assert!(
            m.endpoints[0].member_throughout(0.0, 20.0)
                && !m.endpoints[1].member_throughout(0.0, 20.0)
        );
        let all_late = Membership {
            local_zone: None,
            endpoints: vec![EndpointPlan {
                join_s: 1.0,
                ..EndpointPlan::default()
            }],
        };
        assert!(all_late.validate(Duration::from_secs(5)).is_err());
        assert!(Membership {
            local_zone: None,
            endpoints: vec![EndpointPlan::default()]
        }
        .is_static());
    }
}
