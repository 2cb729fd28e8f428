//! `--recipe FILE`: a custom mix, a GGUF type per tensor-name pattern.
//!
//! ```text
//! # Q4_K routed experts, MXFP4 (lossless) down projections, the rest as q2
//! base q2
//! blk.*.ffn_gate_exps.weight  q4_k
//! blk.*.ffn_up_exps.weight    q4_k
//! blk.*.ffn_down_exps.weight  mxfp4
//! ```
//!
//! One rule a line: a pattern (`*` matches any run of characters, as
//! `--splice --take`) and a type name as GGUF files spell it (`q8_0`,
//! `Q4_K`, `iq2_xxs`, case-insensitive). The first rule that matches a
//! tensor wins; a tensor no rule matches takes the type of the `base`
//! recipe (one of the named ones: q8, mxfp4, q2, q4, f32), and without a
//! `base` line every tensor must match a rule. `#` starts a comment.
//!
//! Every choice is checked before anything is written, with the loader's
//! own rules ([`Class::accepts`]): routed experts take F32, F16, Q8_0, Q2_K,
//! Q4_K, IQ2_XXS or MXFP4, with gate and up of one layer alike; other
//! matrices F32, F16, BF16 or Q8_0; vectors F32 or F16; the hash table
//! stays I32. A rule that matches no tensor is an error too (a misspelt
//! pattern would otherwise change nothing, silently).

use std::path::Path;

use super::layout::{Family, GgufTensor, Layout, Part, Source};
use super::output::glob;
use super::ConvertError;
use crate::model::weights::Class;
use crate::quant::GgmlType;
use crate::testmodel::{self, TestModelSpec, Variant};

/// One `PATTERN TYPE` line.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub pattern: String,
    pub ty: GgmlType,
    /// 1-based, for messages.
    pub line: usize,
}

/// A parsed recipe file.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    /// Where it was read from, for messages.
    pub file: String,
    /// The named recipe of the tensors no rule matches.
    pub base: Option<Variant>,
    pub rules: Vec<Rule>,
}

impl Recipe {
    /// `--recipe`'s value: a named mix (q8, mxfp4, q2, q4, f32), else a
    /// recipe file's path.
    pub fn from_arg(arg: &str) -> Result<Recipe, ConvertError> {
        match Variant::parse(arg) {
            Some(v) => Ok(Recipe::named(v)),
            None => Recipe::load(Path::new(arg)),
        }
    }

    /// A named mix: no rules, every type from `v`.
    pub fn named(v: Variant) -> Recipe {
        Recipe {
            file: v.name().to_string(),
            base: Some(v),
            rules: Vec::new(),
        }
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Recipe, ConvertError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConvertError::Input {
            file: path.display().to_string(),
            msg: format!("cannot read the recipe: {e}"),
        })?;
        Recipe::parse(&text, &path.display().to_string())
    }

    /// Parses a recipe's text; `file` names it in messages.
    pub fn parse(text: &str, file: &str) -> Result<Recipe, ConvertError> {
        let bad = |line: usize, msg: String| ConvertError::Input {
            file: file.to_string(),
            msg: format!("line {line}: {msg}"),
        };
        let mut recipe = Recipe {
            file: file.to_string(),
            base: None,
            rules: Vec::new(),
        };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let words: Vec<&str> = raw
                .split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            match words.as_slice() {
                [] => {}
                ["base", name] => {
                    if recipe.base.is_some() {
                        return Err(bad(line, "a second `base` line".into()));
                    }
                    let v = Variant::parse(name).ok_or_else(|| {
                        bad(
                            line,
                            format!("base {name:?}: expected q8, mxfp4, q2, q4 or f32"),
                        )
                    })?;
                    recipe.base = Some(v);
                }
                [pattern, ty] => {
                    let ty = type_named(ty).ok_or_else(|| {
                        bad(
                            line,
                            format!("unknown type {ty:?} (e.g. q8_0, q4_k, iq2_xxs)"),
                        )
                    })?;
                    recipe.rules.push(Rule {
                        pattern: pattern.to_string(),
                        ty,
                        line,
                    });
                }
                _ => {
                    return Err(bad(
                        line,
                        format!(
                            "expected `PATTERN TYPE` or `base NAME`, found {:?}",
                            raw.trim()
                        ),
                    ))
                }
            }
        }
        if recipe.rules.is_empty() && recipe.base.is_none() {
            return Err(ConvertError::Input {
                file: file.to_string(),
                msg: "the recipe has no rules and no `base` line".into(),
            });
        }
        Ok(recipe)
    }

    /// The type of every tensor of `layout`, in its order: the first
    /// matching rule's, else the `base` mix's, each checked as the loader
    /// will.
    pub fn types(&self, layout: &Layout) -> Result<Vec<GgmlType>, ConvertError> {
        let base_types = match self.base {
            Some(v) => Some(tensor_types(layout, v)?),
            None => None,
        };
        let base_types = base_types.as_deref();
        let mut used = vec![false; self.rules.len()];
        let mut types = Vec::with_capacity(layout.tensors.len());
        for (k, t) in layout.tensors.iter().enumerate() {
            let rule = self.rules.iter().position(|r| glob(&r.pattern, &t.name));
            let ty = match (rule, base_types) {
                (Some(i), _) => {
                    used[i] = true;
                    self.rules[i].ty
                }
                (None, Some(b)) => b[k],
                (None, None) => {
                    return Err(self.err(&t.name, "no rule matches it and there is no `base` line"))
                }
            };
            self.check(t, ty, rule.map(|i| &self.rules[i]))?;
            types.push(ty);
        }
        if let Some(i) = used.iter().position(|u| !u) {
            let r = &self.rules[i];
            return Err(ConvertError::Input {
                file: self.file.clone(),
                msg: format!("line {}: pattern {:?} matches no tensor", r.line, r.pattern),
            });
        }
        self.check_gate_up(layout, &types)?;
        Ok(types)
    }

    fn err(&self, tensor: &str, msg: &str) -> ConvertError {
        ConvertError::Tensor {
            file: self.file.clone(),
            tensor: tensor.to_string(),
            msg: msg.to_string(),
        }
    }

    /// `ty` for `t`: a type the loader accepts for its class, whose blocks
    /// tile its rows.
    fn check(&self, t: &GgufTensor, ty: GgmlType, rule: Option<&Rule>) -> Result<(), ConvertError> {
        let from = match rule {
            Some(r) => format!(" (line {})", r.line),
            None => " (from the base recipe)".to_string(),
        };
        let class = class_of(t);
        if !class.accepts().contains(&ty) {
            let ok: Vec<&str> = class.accepts().iter().map(|t| t.name()).collect();
            let msg = format!(
                "{}{from}: ds4 loads it only as {}",
                ty.name(),
                ok.join(", ")
            );
            return Err(self.err(&t.name, &msg));
        }
        let block = ty.block_elems() as u64;
        if t.ne[0] % block != 0 {
            let msg = format!(
                "{}{from}: rows of {} values do not split into its blocks of {block}",
                ty.name(),
                t.ne[0]
            );
            return Err(self.err(&t.name, &msg));
        }
        Ok(())
    }

    /// A layer's routed gate and up share one type (the expert kernels
    /// read them as a pair).
    fn check_gate_up(&self, layout: &Layout, types: &[GgmlType]) -> Result<(), ConvertError> {
        let index = |name: &str| layout.tensors.iter().position(|t| t.name == name);
        for (k, t) in layout.tensors.iter().enumerate() {
            let Some(prefix) = t.name.strip_suffix("ffn_gate_exps.weight") else {
                continue;
            };
            let up = format!("{prefix}ffn_up_exps.weight");
            if let Some(u) = index(&up) {
                if types[u] != types[k] {
                    let msg = format!(
                        "gate is {} but {up} is {}: a layer's routed gate and up must share a type",
                        types[k].name(),
                        types[u].name()
                    );
                    return Err(self.err(&t.name, &msg));
                }
            }
        }
        Ok(())
    }
}

/// The type of every tensor of `layout` in `variant`: the test-model
/// generator's plan for the same shapes, which must have the same names
/// and shapes in the same order.
pub fn tensor_types(layout: &Layout, variant: Variant) -> Result<Vec<GgmlType>, ConvertError> {
    let spec = TestModelSpec::from_config(&layout.config);
    let plan = match (layout.part, &layout.family) {
        (Part::Main, Family::V41(v)) => {
            testmodel::v41::tensor_types(v, variant, layout.config.n_vocab)
        }
        (Part::Main, Family::V4) => testmodel::tensor_types(&spec, variant, layout.config.n_vocab),
        (Part::Mtp, _) => testmodel::mtp_tensor_types(&spec, variant),
        (Part::Dspark, _) => super::dspark::plan(layout, variant),
    };
    if plan.len() != layout.tensors.len() {
        return Err(ConvertError::Usage(format!(
            "internal: the {} plan has {} tensors, the name map {}",
            variant.name(),
            plan.len(),
            layout.tensors.len()
        )));
    }
    layout
        .tensors
        .iter()
        .zip(plan)
        .map(|(t, (pname, pne, ty))| {
            if pname != t.name || pne != t.ne {
                return Err(ConvertError::Usage(format!(
                    "internal: the {} plan has {pname} {pne:?} where the name map has {} {:?}",
                    variant.name(),
                    t.name,
                    t.ne
                )));
            }
            Ok(ty)
        })
        .collect()
}

/// The loader's class of a tensor of ds4's layout (src/model/weights.rs
/// binds each with one): the routed experts, the hash table, vectors and
/// matrices.
fn class_of(t: &GgufTensor) -> Class {
    if t.name.ends_with("_exps.weight") {
        Class::Expert
    } else if t.name.ends_with("tid2eid") || t.name.ends_with("tid2eid.weight") {
        Class::I32
    } else if matches!(t.source, Source::EngramRows { .. }) {
        Class::I8
    } else if t.ne.len() == 1
        || t.name.ends_with("engram_q_norm.weight")
        || t.name.ends_with("engram_k_norm.weight")
    {
        Class::Vector
    } else {
        Class::Dense
    }
}

/// A type by its GGUF name, case-insensitive (`q4_k`, `Q4_K`, `iq2_xxs`).
fn type_named(name: &str) -> Option<GgmlType> {
    GgmlType::from_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Recipe, ConvertError> {
        Recipe::parse(text, "r.txt")
    }

    #[test]
    fn parses_rules_base_and_comments() {
        let r =
            parse("# mix\nbase q2\n\nblk.*.ffn_down_exps.weight  MXFP4 # lossless\n*attn* q8_0\n")
                .unwrap();
        assert_eq!(r.base, Some(Variant::Q2));
        assert_eq!(r.rules.len(), 2);
        assert_eq!(r.rules[0].ty, GgmlType::Mxfp4);
        assert_eq!(r.rules[0].line, 4);
        assert_eq!(r.rules[1].ty, GgmlType::Q8_0);
        assert_eq!(type_named("q4_k"), Some(GgmlType::Q4K));
        assert_eq!(type_named("IQ2_XXS"), Some(GgmlType::Iq2Xxs));
    }

    #[test]
    fn refuses_malformed_lines_with_their_number() {
        for (text, want) in [
            ("base q3\n", "line 1: base \"q3\""),
            ("x q9_9\n", "line 1: unknown type \"q9_9\""),
            ("\nx q8_0 extra\n", "line 2: expected `PATTERN TYPE`"),
            ("base q2\nbase q4\n", "line 2: a second `base`"),
            ("# nothing\n", "no rules and no `base`"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(
                e.starts_with("r.txt: ") && e.contains(want),
                "{text:?}: {e}"
            );
        }
    }
}
