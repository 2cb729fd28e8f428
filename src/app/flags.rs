//! Backend choice from the command line, shared by `ds4`, `ds4-server` and
//! `ds4-bench`: `--backend NAME` or one of the aliases `--cpu`, `--metal`,
//! `--vulkan`, `--cuda`; at most one of them. Nothing named means `auto`.
//! Also the `--ssd-streaming*` flags ([`StreamingFlags`]), which become
//! [`crate::backend::options::StreamingOptions`].

use crate::backend::options::{CacheBudget, EvictionPolicy, ProfileFile, StreamingOptions};
use crate::backend::BackendKind;

/// The `--ssd-streaming*` flags as the binaries parse them (ds4's
/// spellings and meanings; docs/SSD_STREAMING.md).
#[derive(Clone, Debug, Default)]
pub struct StreamingFlags {
    /// `--ssd-streaming`
    pub on: bool,
    /// `--ssd-streaming-cache-experts N|NGB`
    pub cache_experts: Option<String>,
    /// `--ssd-streaming-full-layers N`
    pub full_layers: Option<usize>,
    /// `--ssd-streaming-cold`
    pub cold: bool,
    /// `--ssd-streaming-preload-experts N`
    pub preload_experts: Option<usize>,
}

impl StreamingFlags {
    /// The streaming options, `None` without `--ssd-streaming`. The other
    /// flags without it are an error (they would silently do nothing).
    pub fn options(&self) -> Result<Option<StreamingOptions>, String> {
        if !self.on {
            let given = self.cache_experts.is_some()
                || self.full_layers.is_some()
                || self.cold
                || self.preload_experts.is_some();
            return if given {
                Err("the --ssd-streaming-* options need --ssd-streaming".into())
            } else {
                Ok(None)
            };
        }
        let mut o = StreamingOptions::default();
        if let Some(s) = &self.cache_experts {
            o.budget = CacheBudget::parse(s)?;
        }
        if let Some(n) = self.full_layers {
            o.full_layers = n;
        }
        o.cold = self.cold;
        if let Some(n) = self.preload_experts {
            if n == 0 {
                return Err("--ssd-streaming-preload-experts must be positive".into());
            }
            if self.cold {
                return Err("--ssd-streaming-preload-experts and --ssd-streaming-cold contradict each other".into());
            }
            o.preload_experts = Some(n);
        }
        o.policy = EvictionPolicy::default();
        // The binaries record the popularity profile next to the model.
        o.profile = ProfileFile::NextToModel;
        Ok(Some(o))
    }
}

/// The backend flags as the binaries parse them.
#[derive(Clone, Debug, Default)]
pub struct BackendFlags {
    pub backend: Option<String>,
    pub cpu: bool,
    pub metal: bool,
    pub vulkan: bool,
    pub cuda: bool,
}

impl BackendFlags {
    /// The chosen backend; `auto` (a real GPU through wgpu, else CUDA when
    /// built and present, else the fast CPU backend) when none is named.
    pub fn resolve(&self) -> Result<BackendKind, String> {
        let n = [self.cpu, self.metal, self.vulkan, self.cuda]
            .iter()
            .filter(|&&x| x)
            .count()
            + self.backend.is_some() as usize;
        if n > 1 {
            return Err("choose one backend (--backend, --cpu, --metal, --vulkan, --cuda)".into());
        }
        if self.cpu {
            return Ok(BackendKind::Cpu);
        }
        if self.metal || self.vulkan {
            return Ok(BackendKind::Wgpu);
        }
        if self.cuda {
            return Ok(BackendKind::Cuda);
        }
        match &self.backend {
            Some(b) => BackendKind::parse(b).map_err(|e| e.to_string()),
            None => Ok(BackendKind::Auto),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_flags_follow_ds4() {
        assert_eq!(StreamingFlags::default().options(), Ok(None));
        let f = StreamingFlags {
            cold: true,
            ..Default::default()
        };
        assert!(f.options().unwrap_err().contains("need --ssd-streaming"));
        let f = StreamingFlags {
            on: true,
            cache_experts: Some("32GB".into()),
            full_layers: Some(2),
            ..Default::default()
        };
        let o = f.options().unwrap().unwrap();
        assert_eq!(o.budget, CacheBudget::Bytes(32 << 30));
        assert_eq!(o.full_layers, 2);
        assert_eq!(CacheBudget::parse("7"), Ok(CacheBudget::Experts(7)));
        assert_eq!(CacheBudget::parse("1.5GB"), Ok(CacheBudget::Bytes(3 << 29)));
        assert_eq!(
            CacheBudget::parse("64MiB"),
            Ok(CacheBudget::Bytes(64 << 20))
        );
        for bad in ["0", "", "x", "-3", "5TB", "0GB"] {
            assert!(CacheBudget::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_flag_at_most() {
        let f = BackendFlags {
            cpu: true,
            backend: Some("cpu".into()),
            ..Default::default()
        };
        assert!(f.resolve().is_err());
        assert_eq!(BackendFlags::default().resolve(), Ok(BackendKind::Auto));
        let f = BackendFlags {
            vulkan: true,
            ..Default::default()
        };
        assert_eq!(f.resolve(), Ok(BackendKind::Wgpu));
        let f = BackendFlags {
            backend: Some("nope".into()),
            ..Default::default()
        };
        assert!(f.resolve().unwrap_err().contains("nope"));
    }
}
