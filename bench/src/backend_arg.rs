//! `ewma-bench backends --backend name=...,addr=...,latency=...`: a backend from one argument.

use anyhow::{bail, Context, Result};
use harness::{BackendSpec, Latency};

/// Parses a CLI backend: `name=N,addr=IP:PORT,latency=L[,capacity=K][,fail=R][,health=L][,orca=fixed:U|busy:K:B][,phase=FROM-TO@L]...`.
/// A comma inside a value (as in `lognormal:80,0.5`) is kept when the next piece has no `=`.
pub fn parse_backend_arg(s: &str) -> Result<(BackendSpec, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for piece in s.split(',') {
        match piece.split_once('=') {
            Some((k, v)) => pairs.push((k.trim().to_string(), v.trim().to_string())),
            None => match pairs.last_mut() {
                Some((_, v)) => {
                    v.push(',');
                    v.push_str(piece.trim());
                }
                None => bail!("backend {s:?}: expected key=value pairs"),
            },
        }
    }
    let mut spec = BackendSpec::new("", Latency::Fixed(0));
    let mut addr = "127.0.0.1:0".to_string();
    for (k, v) in pairs {
        match k.as_str() {
            "name" => spec.name = v,
            "addr" => addr = v,
            "latency" => spec.latency = v.parse()?,
            "capacity" => {
                spec.capacity = Some(v.parse().with_context(|| format!("capacity {v:?}"))?)
            }
            "fail" => spec.fail_rate = v.parse().with_context(|| format!("fail {v:?}"))?,
            "health" | "health_latency" => spec.health_latency = v.parse()?,
            "phase" => spec.schedule.push(v.parse()?),
            "orca" => spec.orca = Some(v.parse()?),
            other => bail!("backend {s:?}: unknown key {other:?}"),
        }
    }
    spec.validate()?;
    Ok((spec, addr))
}

#[cfg(test)]
mod tests {
    use harness::Phase;

    use super::*;

    #[test]
    fn parses_cli_backend_with_comma_inside_latency() {
        let (spec, addr) =
            parse_backend_arg("name=slow,addr=127.0.0.1:8083,latency=lognormal:80,0.5,capacity=8,fail=0.01,orca=busy:8:0.25,phase=10-20@fixed:500")
                .unwrap();
        assert_eq!(
            spec.orca,
            Some(harness::Orca::Busy {
                capacity: 8,
                background: 0.25
            })
        );
        assert_eq!(spec.name, "slow");
        assert_eq!(addr, "127.0.0.1:8083");
        assert_eq!(
            spec.latency,
            Latency::LogNormal {
                median_ms: 80.0,
                sigma: 0.5
            }
        );
        assert_eq!(spec.capacity, Some(8));
        assert_eq!(spec.fail_rate, 0.01);
        assert_eq!(
            spec.schedule,
            vec![Phase {
                from_s: 10.0,
                to_s: 20.0,
                latency: Latency::Fixed(500)
            }]
        );
    }

    #[test]
    fn rejects_bad_cli_backends() {
        for bad in [
            "latency=fixed:1",
            "name=a,fail=2",
            "name=a,capacity=0",
            "name=a,color=red",
            "name=a,phase=5-1@fixed:1",
        ] {
            assert!(
                parse_backend_arg(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}
