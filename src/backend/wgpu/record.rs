//! From a recorded graph to a dispatch list: the one exhaustive match of
//! this backend over [`Op`], one line per op, each handing the op to its
//! family's launch file (`launch/<family>.rs` ↔ `shaders/<family>.wgsl`).
//! Each op gets its pipeline, its parameter uniform and its bind group
//! there, once; weights it reads are uploaded on first use and shared by
//! every graph.

use super::launch::{self as l, Cx};
use super::{LoadedGraph, WgpuBackend, Work};
use crate::backend::kernels::launch_op;
use crate::backend::BackendError;
use crate::gguf::GgufFile;
use crate::graph::ops::Op;
use crate::graph::Node;

/// The dispatches of one op: the one match over [`Op`], shared with the other
/// GPU backend ([`launch_op`]), each arm calling its family's launch file.
fn op(cx: &mut Cx, op: &Op) -> Result<Vec<Work>, BackendError> {
    launch_op!(l, cx, op)
}

/// The dispatch lists of `g`, split at its flush points.
pub(super) fn record(
    b: &mut WgpuBackend,
    g: &LoadedGraph,
) -> Result<Vec<Vec<(&'static str, Work)>>, BackendError> {
    let file_arc = b.file.clone();
    let file: &GgufFile = (*file_arc).as_ref();
    let mut cx = Cx {
        b,
        g,
        file,
        scratch: None,
        f16_values: g
            .graph
            .ops()
            .filter_map(|op| match op {
                Op::KvRound(k) if k.f16 => Some(k.out),
                _ => None,
            })
            .collect(),
    };
    let mut segments = vec![Vec::new()];
    for node in &g.graph.nodes {
        match node {
            Node::Op(o) => {
                let w = op(&mut cx, o)?;
                let name = o.name();
                segments
                    .last_mut()
                    .expect("one segment")
                    .extend(w.into_iter().map(|w| (name, w)));
            }
            Node::Flush => {
                if !segments.last().expect("one segment").is_empty() {
                    segments.push(Vec::new());
                }
            }
        }
    }
    cx.b.gpu.check()?;
    Ok(segments)
}
