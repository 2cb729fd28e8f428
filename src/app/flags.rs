//! The flags the three binaries share, declared once: the backend choice
//! (`--backend NAME` or one of the aliases `--cpu`, `--metal`, `--vulkan`,
//! `--cuda`; at most one of them, nothing named means `auto`), the
//! `--ssd-streaming*` flags, speculative decoding (`--spec`, `--mtp`,
//! `--dspark`, `--mtp-model`, `--draft`; [`SpecFlags`]) and the CPU thread
//! count. [`cli_args!`](crate::cli_args)
//! splices their argh fields, with their one help text, into each binary's
//! argument struct; [`BackendFlags`] and [`StreamingFlags`] turn them into a
//! [`BackendKind`] and [`crate::backend::options::StreamingOptions`].

use std::path::PathBuf;

use crate::backend::options::{CacheBudget, EvictionPolicy, ProfileFile, StreamingOptions};
use crate::backend::BackendKind;
use crate::session::MAX_VERIFY_ROWS;
use crate::speculate::{SpecKind, DEFAULT_MAX_DRAFT};

/// The speculative-decoding flags as the binaries parse them (ds4's
/// `--mtp`, `--dspark`, `--mtp-model FILE`, plus `--spec` and `--draft`;
/// docs/SPECULATIVE.md).
#[derive(Clone, Debug, Default)]
pub struct SpecFlags {
    /// `--spec lookup|mtp|dspark|off`
    pub spec: Option<String>,
    /// `--mtp`
    pub mtp: bool,
    /// `--dspark`
    pub dspark: bool,
    /// `--mtp-model FILE`
    pub mtp_model: Option<PathBuf>,
    /// `--draft N`
    pub draft: Option<usize>,
    /// `--draft-fixed`
    pub draft_fixed: bool,
}

/// What the speculative-decoding flags ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecChoice {
    pub kind: SpecKind,
    /// The drafter's GGUF (`--mtp-model`): MTP and DSpark.
    pub drafter_file: Option<PathBuf>,
    /// The longest draft (`--draft`, default [`DEFAULT_MAX_DRAFT`]).
    pub max_draft: usize,
    /// Always draft `max_draft` (`--draft-fixed`) instead of adapting.
    pub fixed: bool,
}

impl SpecChoice {
    pub fn off() -> SpecChoice {
        SpecChoice {
            kind: SpecKind::Off,
            drafter_file: None,
            max_draft: DEFAULT_MAX_DRAFT,
            fixed: false,
        }
    }

    pub fn on(&self) -> bool {
        self.kind != SpecKind::Off
    }
}

impl SpecFlags {
    /// The drafter, its file and the draft length; contradictions and
    /// missing pieces are errors naming the flags.
    pub fn resolve(&self) -> Result<SpecChoice, String> {
        let named = match &self.spec {
            Some(s) => Some(SpecKind::parse(s).ok_or_else(|| {
                format!("--spec: expected lookup, mtp, dspark or off, got {s:?}")
            })?),
            None => None,
        };
        let switch = match (self.mtp, self.dspark) {
            (true, true) => return Err("choose one of --mtp and --dspark".into()),
            (true, false) => Some(SpecKind::Mtp),
            (false, true) => Some(SpecKind::Dspark),
            (false, false) => None,
        };
        let kind = match (named, switch) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!("--spec {} contradicts --{}", a.name(), b.name()))
            }
            (a, b) => a.or(b).unwrap_or(SpecKind::Off),
        };
        let needs_file = matches!(kind, SpecKind::Mtp | SpecKind::Dspark);
        if needs_file && self.mtp_model.is_none() {
            return Err(format!(
                "--{} needs the drafter's GGUF: --mtp-model FILE",
                kind.name()
            ));
        }
        if !needs_file && self.mtp_model.is_some() {
            return Err("--mtp-model goes with --mtp or --dspark".into());
        }
        let max_draft = self.draft.unwrap_or(DEFAULT_MAX_DRAFT);
        if kind != SpecKind::Off && !(1..MAX_VERIFY_ROWS).contains(&max_draft) {
            return Err(format!(
                "--draft must be in 1..={}, got {max_draft}",
                MAX_VERIFY_ROWS - 1
            ));
        }
        if kind == SpecKind::Off && (self.draft.is_some() || self.draft_fixed) {
            return Err("--draft and --draft-fixed go with --spec, --mtp or --dspark".into());
        }
        Ok(SpecChoice {
            kind,
            drafter_file: self.mtp_model.clone(),
            max_draft,
            fixed: self.draft_fixed,
        })
    }
}

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
    /// Whether any of the `--ssd-streaming*` flags is given.
    pub fn named(&self) -> bool {
        self.on
            || self.cache_experts.is_some()
            || self.full_layers.is_some()
            || self.cold
            || self.preload_experts.is_some()
    }

    /// The streaming options, `None` without `--ssd-streaming`. The other
    /// flags without it are an error (they would silently do nothing).
    pub fn options(&self) -> Result<Option<StreamingOptions>, String> {
        if !self.on {
            return if self.named() {
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

/// Declares a binary's argh struct with the flags the three binaries share
/// spliced in where the struct names their group:
///
/// ```text
/// ds4::cli_args! {
///     /// ds4-bench — …
///     #[derive(FromArgs)]
///     struct Args {
///         /// model GGUF (default ./ds4flash.gguf)
///         #[argh(option, short = 'm')]
///         model: Option<PathBuf>,
///         ..BackendFlags,   // --backend, --cpu, --metal, --vulkan, --cuda
///         ..StreamingFlags, // --ssd-streaming and its five companions
///         ..Threads,        // -t, --threads
///     }
/// }
/// ```
///
/// argh cannot flatten one struct into another, so the shared flags are
/// fields of each binary's own struct; this macro keeps their spelling and
/// help text in one place and leaves each binary its own `--help` order.
/// A struct that names a group also gets its method: `backend_flags()`
/// ([`BackendFlags`]) or `streaming_flags()` ([`StreamingFlags`]).
///
/// The struct's own fields are written as usual, each with a trailing comma;
/// a field's type is a name with at most one generic argument
/// (`usize`, `Option<PathBuf>`, `Vec<String>`), which covers every flag the
/// binaries have. Types pass through as plain tokens, not as `ty` fragments:
/// an opaque `ty` would hide `Option<…>` and `Vec<…>` from argh, which reads
/// them to make a flag optional or repeatable.
#[macro_export]
macro_rules! cli_args {
    (
        $(#[$($attr:tt)*])*
        struct $name:ident { $($body:tt)* }
    ) => {
        $crate::cli_args!(@munch [$(#[$($attr)*])* struct $name] [$name] [] [] $($body)*);
    };
    (@munch [$($head:tt)*] [$name:ident] [$($fields:tt)*] [$($impls:tt)*]) => {
        $($head)* { $($fields)* }
        impl $name { $($impls)* }
    };
    (@munch $head:tt $name:tt [$($fields:tt)*] [$($impls:tt)*] ..BackendFlags, $($rest:tt)*) => {
        $crate::cli_args!(@munch $head $name [$($fields)*
            /// backend: auto (default: a real GPU through wgpu, else CUDA, else
            /// the fast cpu), cpu (fast: int8 SIMD kernels;
            /// DS4_CPU_ISA=portable|avx2 forces a path), cpu-ref (the f32
            /// reference), wgpu (aliases metal, vulkan), cuda
            #[argh(option)]
            backend: Option<String>,
            /// same as --backend cpu
            #[argh(switch)]
            cpu: bool,
            /// same as --backend wgpu (Metal on macOS)
            #[argh(switch)]
            metal: bool,
            /// same as --backend wgpu (Vulkan where there is no Metal)
            #[argh(switch)]
            vulkan: bool,
            /// same as --backend cuda
            #[argh(switch)]
            cuda: bool,
        ] [$($impls)*
            /// `--backend`, `--cpu`, `--metal`, `--vulkan`, `--cuda`.
            fn backend_flags(&self) -> $crate::app::flags::BackendFlags {
                $crate::app::flags::BackendFlags {
                    backend: self.backend.clone(),
                    cpu: self.cpu,
                    metal: self.metal,
                    vulkan: self.vulkan,
                    cuda: self.cuda,
                }
            }
        ] $($rest)*);
    };
    (@munch $head:tt $name:tt [$($fields:tt)*] [$($impls:tt)*] ..StreamingFlags, $($rest:tt)*) => {
        $crate::cli_args!(@munch $head $name [$($fields)*
            /// stream routed experts from the GGUF into a bounded cache instead of
            /// keeping them resident (every backend: the cpu ones read the cache,
            /// wgpu and cuda keep the cached experts in device slots;
            /// docs/SSD_STREAMING.md)
            #[argh(switch)]
            ssd_streaming: bool,
            /// with --ssd-streaming: the expert cache as experts per layer (N) or
            /// a size (NGB; default 32GB)
            #[argh(option)]
            ssd_streaming_cache_experts: Option<String>,
            /// with --ssd-streaming: keep the first N routed layers whole
            #[argh(option)]
            ssd_streaming_full_layers: Option<usize>,
            /// with --ssd-streaming: start with an empty cache (no preload)
            #[argh(switch)]
            ssd_streaming_cold: bool,
            /// with --ssd-streaming: preload only the N most popular experts per layer
            #[argh(option)]
            ssd_streaming_preload_experts: Option<usize>,
        ] [$($impls)*
            /// The `--ssd-streaming*` flags.
            fn streaming_flags(&self) -> $crate::app::flags::StreamingFlags {
                $crate::app::flags::StreamingFlags {
                    on: self.ssd_streaming,
                    cache_experts: self.ssd_streaming_cache_experts.clone(),
                    full_layers: self.ssd_streaming_full_layers,
                    cold: self.ssd_streaming_cold,
                    preload_experts: self.ssd_streaming_preload_experts,
                }
            }
        ] $($rest)*);
    };
    (@munch $head:tt $name:tt [$($fields:tt)*] [$($impls:tt)*] ..SpecFlags, $($rest:tt)*) => {
        $crate::cli_args!(@munch $head $name [$($fields)*
            /// speculative decoding: lookup (n-grams of the prompt and output, no
            /// model), mtp, dspark (need --mtp-model), off (default); greedy and
            /// sampled output are plain decoding's, token for token
            #[argh(option)]
            spec: Option<String>,
            /// same as --spec mtp: V4 Flash's MTP head as the drafter
            #[argh(switch)]
            mtp: bool,
            /// same as --spec dspark: DeepSeek's DSpark drafter
            #[argh(switch)]
            dspark: bool,
            /// the drafter GGUF for --mtp or --dspark
            #[argh(option)]
            mtp_model: Option<std::path::PathBuf>,
            /// longest draft per step (default 5, at most 15); the adaptive policy
            /// drafts 0..N as it pays
            #[argh(option)]
            draft: Option<usize>,
            /// always draft --draft tokens (no adaptive policy; benchmarks)
            #[argh(switch)]
            draft_fixed: bool,
        ] [$($impls)*
            /// `--spec`, `--mtp`, `--dspark`, `--mtp-model`, `--draft`.
            fn spec_flags(&self) -> $crate::app::flags::SpecFlags {
                $crate::app::flags::SpecFlags {
                    spec: self.spec.clone(),
                    mtp: self.mtp,
                    dspark: self.dspark,
                    mtp_model: self.mtp_model.clone(),
                    draft: self.draft,
                    draft_fixed: self.draft_fixed,
                }
            }
        ] $($rest)*);
    };
    (@munch $head:tt $name:tt [$($fields:tt)*] $impls:tt ..Threads, $($rest:tt)*) => {
        $crate::cli_args!(@munch $head $name [$($fields)*
            /// CPU threads (default: physical cores)
            #[argh(option, short = 't')]
            threads: Option<usize>,
        ] $impls $($rest)*);
    };
    (@munch $head:tt $name:tt [$($fields:tt)*] $impls:tt
        $(#[$($a:tt)*])*
        $field:ident : $ty:ident $(< $($arg:ident)::+ >)?,
        $($rest:tt)*
    ) => {
        $crate::cli_args!(@munch $head $name
            [$($fields)* $(#[$($a)*])* $field: $ty $(< $($arg)::+ >)?,] $impls $($rest)*);
    };
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
    fn spec_flags_refuse_contradictions() {
        assert_eq!(SpecFlags::default().resolve(), Ok(SpecChoice::off()));
        let f = SpecFlags {
            spec: Some("lookup".into()),
            draft: Some(8),
            ..Default::default()
        };
        let c = f.resolve().unwrap();
        assert_eq!((c.kind, c.max_draft), (SpecKind::Lookup, 8));
        let bad = [
            (
                SpecFlags {
                    spec: Some("ngram".into()),
                    ..Default::default()
                },
                "--spec",
            ),
            (
                SpecFlags {
                    mtp: true,
                    dspark: true,
                    ..Default::default()
                },
                "one of",
            ),
            (
                SpecFlags {
                    mtp: true,
                    ..Default::default()
                },
                "--mtp-model",
            ),
            (
                SpecFlags {
                    spec: Some("lookup".into()),
                    dspark: true,
                    ..Default::default()
                },
                "contradicts",
            ),
            (
                SpecFlags {
                    mtp_model: Some("x.gguf".into()),
                    ..Default::default()
                },
                "goes with",
            ),
            (
                SpecFlags {
                    spec: Some("lookup".into()),
                    draft: Some(16),
                    ..Default::default()
                },
                "1..=15",
            ),
            (
                SpecFlags {
                    draft: Some(3),
                    ..Default::default()
                },
                "go with",
            ),
        ];
        for (f, want) in bad {
            let e = f.resolve().unwrap_err();
            assert!(e.contains(want), "{f:?}: {e}");
        }
        let f = SpecFlags {
            dspark: true,
            mtp_model: Some("d.gguf".into()),
            ..Default::default()
        };
        assert_eq!(f.resolve().unwrap().kind, SpecKind::Dspark);
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
