//! Backend choice from the command line, shared by `ds4`, `ds4-server` and
//! `ds4-bench`: `--backend NAME` or one of the aliases `--cpu`, `--metal`,
//! `--vulkan`, `--cuda`; at most one of them. Nothing named means `auto`.

use crate::backend::BackendKind;

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
