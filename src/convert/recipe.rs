//! Which type each output tensor gets.
//!
//! A recipe starts from one of ds4's named mixes (GGUF.md §5, docs/QUANTS.md):
//!
//! | name | routed gate / up | routed down | dense projections, shared experts, head | tables, mixers, compressors, indexer |
//! |---|---|---|---|---|
//! | `q2` | IQ2_XXS | Q2_K | Q8_0 | F16 |
//! | `q4` | Q4_K | Q4_K | Q8_0 | F16 |
//! | `mxfp4` | MXFP4 (the checkpoint's FP4, copied) | MXFP4 | Q8_0 | F16 |
//! | `q8` | Q8_0 | Q8_0 | Q8_0 | F16 |
//! | `f32` | F32 | F32 | F32 | F32 |
//! | `lossless` | MXFP4 | MXFP4 | BF16 (FP8 × scale is exact in BF16), else the source type | same |
//!
//! Norms, biases and HC scale/base are F32 and the hash table I32 in every
//! mix. A recipe file (`--recipe FILE`) names a base and then overrides
//! per tensor pattern, later lines winning:
//!
//! ```text
//! # Q4 experts for a 192 GB machine, lossless attention
//! base q2
//! blk.*.ffn_*_exps.weight   q4_k
//! blk.*.attn_*.weight       lossless
//! ```
//!
//! `*` matches any run of characters. A type is a ggml name (`q8_0`,
//! `iq2_xxs`, `bf16`, …) or `lossless`. Every choice is checked against
//! what ds4's loader accepts for that tensor before anything is written.

use super::layout::OutTensor;
use super::safetensors::Dtype;
use super::ConvertError;
use crate::quant::GgmlType;
use crate::testmodel::{Class, Variant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Type(GgmlType),
    /// The narrowest type that holds the source exactly.
    Lossless,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    Variant(Variant),
    Lossless,
}

#[derive(Clone, Debug)]
struct Rule {
    pattern: String,
    target: Target,
    /// Where the rule was written (for messages).
    origin: String,
}

/// A named mix plus pattern overrides.
#[derive(Clone, Debug)]
pub struct Recipe {
    pub name: String,
    base: Base,
    rules: Vec<Rule>,
}

fn parse_base(s: &str) -> Option<Base> {
    match s {
        "lossless" => Some(Base::Lossless),
        _ => Variant::parse(s).map(Base::Variant),
    }
}

fn parse_target(s: &str) -> Option<Target> {
    if s.eq_ignore_ascii_case("lossless") {
        return Some(Target::Lossless);
    }
    GgmlType::from_name(s).map(Target::Type)
}

/// Glob match with `*` only.
pub fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

impl Recipe {
    /// One of the named mixes.
    pub fn named(name: &str) -> Result<Recipe, ConvertError> {
        let base = parse_base(name).ok_or_else(|| {
            ConvertError::Usage(format!(
                "unknown recipe {name:?} (q2, q4, q8, mxfp4, f32, lossless, or a recipe file)"
            ))
        })?;
        Ok(Recipe {
            name: name.to_string(),
            base,
            rules: Vec::new(),
        })
    }

    /// Parses a recipe file.
    pub fn parse(text: &str, file: &str) -> Result<Recipe, ConvertError> {
        let mut base = None;
        let mut rules = Vec::new();
        let bad = |line: usize, msg: String| ConvertError::Usage(format!("recipe {file} line {line}: {msg}"));
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() != 2 {
                return Err(bad(i + 1, format!("expected `PATTERN TYPE` or `base NAME`, got {line:?}")));
            }
            if words[0] == "base" {
                if base.is_some() || !rules.is_empty() {
                    return Err(bad(i + 1, "`base` must come once, first".into()));
                }
                base = Some(parse_base(words[1]).ok_or_else(|| {
                    bad(i + 1, format!("unknown base {:?} (q2, q4, q8, mxfp4, f32, lossless)", words[1]))
                })?);
                continue;
            }
            let target = parse_target(words[1])
                .ok_or_else(|| bad(i + 1, format!("unknown type {:?}", words[1])))?;
            rules.push(Rule {
                pattern: words[0].to_string(),
                target,
                origin: format!("recipe {file} line {}", i + 1),
            });
        }
        Ok(Recipe {
            name: file.to_string(),
            base: base.unwrap_or(Base::Variant(Variant::Q2)),
            rules,
        })
    }

    /// Checks that every rule matches some tensor (a typo otherwise silently
    /// changes nothing).
    pub fn check_rules_used(&self, tensors: &[OutTensor]) -> Result<(), ConvertError> {
        for r in &self.rules {
            if !tensors.iter().any(|t| glob(&r.pattern, &t.name)) {
                return Err(ConvertError::Usage(format!(
                    "{}: pattern {:?} matches no tensor of this model",
                    r.origin, r.pattern
                )));
            }
        }
        Ok(())
    }

    /// The type of `t`, whose checkpoint source has dtype `src` (FP4 when
    /// `fp4`), checked against what the loader accepts.
    pub fn type_for(&self, t: &OutTensor, src: Dtype, fp4: bool) -> Result<GgmlType, ConvertError> {
        let mut target = match self.base {
            Base::Variant(v) => Target::Type(v.type_for(t.class)),
            Base::Lossless => Target::Lossless,
        };
        let mut origin = format!("recipe {}", self.name);
        for r in &self.rules {
            if glob(&r.pattern, &t.name) {
                target = r.target;
                origin = r.origin.clone();
            }
        }
        // Vectors, tables and raw rows have one type whatever the mix.
        let ty = match (t.class, target) {
            (Class::Table, _) => GgmlType::I32,
            (Class::EngramRows, _) => GgmlType::I8,
            (Class::Vector, Target::Lossless) => GgmlType::F32,
            (_, Target::Type(ty)) => ty,
            (_, Target::Lossless) => lossless(src, fp4),
        };
        let accepted = accepted(t.class);
        if !accepted.contains(&ty) {
            return Err(ConvertError::Usage(format!(
                "{origin}: {ty} for {} is not something ds4 loads there (accepted: {})",
                t.name,
                accepted.iter().map(|x| x.name()).collect::<Vec<_>>().join(", ")
            )));
        }
        if ty.row_bytes(t.ne[0]).is_none() {
            return Err(ConvertError::Usage(format!(
                "{origin}: {ty} for {}: rows of {} are not a whole number of {}-blocks",
                t.name,
                t.ne[0],
                ty.block_elems()
            )));
        }
        Ok(ty)
    }
}

/// The narrowest type holding `src` exactly.
fn lossless(src: Dtype, fp4: bool) -> GgmlType {
    match src {
        _ if fp4 => GgmlType::Mxfp4,
        Dtype::F16 => GgmlType::F16,
        Dtype::Bf16 | Dtype::F8E4m3 => GgmlType::Bf16,
        _ => GgmlType::F32,
    }
}

/// What ds4's loaders accept per storage class (src/model/weights.rs).
fn accepted(c: Class) -> &'static [GgmlType] {
    use GgmlType::*;
    match c {
        Class::F16Dense | Class::Q8Dense => &[F32, F16, Bf16, Q8_0],
        Class::ExpertGateUp | Class::ExpertDown => &[F32, F16, Q8_0, Q2K, Q4K, Iq2Xxs, Mxfp4],
        Class::Vector => &[F32, F16],
        Class::Table => &[I32],
        Class::EngramRows => &[I8],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("blk.*.ffn_*_exps.weight", "blk.12.ffn_down_exps.weight"));
        assert!(!glob("blk.*.ffn_*_exps.weight", "blk.12.ffn_down_shexp.weight"));
        assert!(glob("*", "anything"));
        assert!(glob("output.weight", "output.weight"));
        assert!(!glob("output.weight", "output_norm.weight"));
        assert!(!glob("a*a", "a"));
    }
}
