//! Integration tests live in `tests/`. The library holds what several of them and the
//! `graph_fuzz` driver share: the random graph generator, its oracle and its minimiser (issue 38,
//! docs/reliability.md "Random graphs").

pub mod campaign;
pub mod findings;
pub mod graphgen;
pub mod oracle;
pub mod shrink;
