//! `docs/target.md` is the specification: every constant row of its tables must equal the value in
//! `core/src/target.rs`, and every constant of that module must be in the document.

use ipu_core::target::{self, csr, zone};
use std::collections::BTreeMap;

/// The code's constants by the name the document uses.
fn code_constants() -> BTreeMap<&'static str, f64> {
    BTreeMap::from([
        ("NUM_TILES", target::NUM_TILES as f64),
        ("WORKERS", target::WORKERS as f64),
        ("BARREL_SLOTS", target::BARREL_SLOTS as f64),
        ("CLOCK_HZ", target::CLOCK_HZ),
        ("TILE_MEM_BASE", target::TILE_MEM_BASE as f64),
        ("TILE_MEM_END", target::TILE_MEM_END as f64),
        ("TILE_MEM_SIZE", target::TILE_MEM_SIZE as f64),
        ("EXEC_REGION_END", target::EXEC_REGION_END as f64),
        ("MEM_ELEMENT_BYTES", target::MEM_ELEMENT_BYTES as f64),
        ("SYNC_CYCLES", target::SYNC_CYCLES as f64),
        ("EXCHANGE_BASE_LATENCY", target::EXCHANGE_BASE_LATENCY as f64),
        ("EXCHANGE_CYCLES_PER_COLUMN", target::EXCHANGE_CYCLES_PER_COLUMN as f64),
        ("EXCHANGE_CYCLES_PER_ROW", target::EXCHANGE_CYCLES_PER_ROW as f64),
        ("EXCHANGE_CYCLES_LANE", target::EXCHANGE_CYCLES_LANE as f64),
        ("MUX_NONE", target::MUX_NONE as f64),
        ("SEND_MAX_WORDS", target::SEND_MAX_WORDS as f64),
        ("RPT_MAX_COUNT", target::RPT_MAX_COUNT as f64),
        ("CWEI_LOAD_CYCLES", target::CWEI_LOAD_CYCLES as f64),
        ("CWEI_BYTES", target::CWEI_BYTES as f64),
        ("CWEI_HALF_LOAD_CYCLES", target::CWEI_HALF_LOAD_CYCLES as f64),
        ("CWEI_HALF_BYTES", target::CWEI_HALF_BYTES as f64),
        ("HOST_AREA_BASE", target::HOST_AREA_BASE as f64),
        ("HOST_AREA_BYTES", target::HOST_AREA_BYTES as f64),
        ("HOST_PAGE_BYTES", target::HOST_PAGE_BYTES as f64),
        ("AMP_F16_MACS_PER_CYCLE", target::AMP_F16_MACS_PER_CYCLE as f64),
        ("AMP_F32_MACS_PER_CYCLE", target::AMP_F32_MACS_PER_CYCLE as f64),
        ("AMP_F8_MACS_PER_CYCLE", target::AMP_F8_MACS_PER_CYCLE as f64),
        ("zone::LOCAL", zone::LOCAL as f64),
        ("zone::INTERNAL", zone::INTERNAL as f64),
        ("zone::HOST", zone::HOST as f64),
        ("csr::INCOMING_MUX", csr::INCOMING_MUX as f64),
        ("csr::INCOMING_BASE", csr::INCOMING_BASE as f64),
        ("csr::INCOMING_DCOUNT", csr::INCOMING_DCOUNT as f64),
        ("csr::OUTGOING_BASE", csr::OUTGOING_BASE as f64),
        ("csr::FP_INFMT", csr::FP_INFMT as f64),
        ("csr::FP_ISCL", csr::FP_ISCL as f64),
        ("csr::COUNT_L", csr::COUNT_L as f64),
        ("csr::COUNT_U", csr::COUNT_U as f64),
        ("csr::TILE_ID", csr::TILE_ID as f64),
        ("csr::FP_NFMT", csr::FP_NFMT as f64),
        ("csr::FP_SCL", csr::FP_SCL as f64),
    ])
}

/// The first number of a value cell: `0x4C000`, `1472 (…)`, `1.33e9`, `16 KiB`.
fn parse_value(cell: &str) -> Option<f64> {
    let word = cell.split_whitespace().next()?.trim_end_matches([':', ',']);
    let v = if let Some(h) = word.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()? as f64
    } else {
        word.parse::<f64>().ok()?
    };
    let unit = cell.split_whitespace().nth(1).unwrap_or("");
    Some(if unit == "KiB" { v * 1024.0 } else { v })
}

/// `(name, value cell)` of every table row whose first cell is a backquoted constant name.
fn doc_rows(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            if cells.len() < 4 || !cells[0].is_empty() {
                return None;
            }
            let name = cells[1].strip_prefix('`')?.split('`').next()?;
            let is_const =
                name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || "_:".contains(c))
                    || name.starts_with("zone::")
                    || name.starts_with("csr::");
            (is_const && name.chars().any(|c| c.is_ascii_uppercase()))
                .then(|| (name.to_string(), cells[2].to_string()))
        })
        .collect()
}

#[test]
fn target_constants_match_doc() {
    let doc = include_str!("../../docs/target.md");
    let code = code_constants();
    let rows = doc_rows(doc);
    assert!(rows.len() >= code.len(), "only {} constant rows parsed from docs/target.md", rows.len());
    let mut seen = BTreeMap::new();
    for (name, cell) in &rows {
        let want = code
            .get(name.as_str())
            .unwrap_or_else(|| panic!("docs/target.md lists `{name}`, target.rs has no such constant"));
        let got = parse_value(cell).unwrap_or_else(|| panic!("`{name}`: no number in `{cell}`"));
        assert_eq!(got, *want, "`{name}`: docs/target.md says {cell}, target.rs has {want}");
        assert!(seen.insert(name.clone(), got).is_none(), "`{name}` listed twice");
    }
    for name in code.keys() {
        assert!(seen.contains_key(*name), "`{name}` is in target.rs but not in docs/target.md");
    }
}

#[test]
fn every_constant_of_target_rs_is_checked() {
    // A constant added to target.rs without a row in the map above (and so in the doc) fails here.
    let src = include_str!("../../core/src/target.rs");
    let code = code_constants();
    let mut module = "";
    for line in src.lines() {
        let l = line.trim();
        if let Some(m) = l.strip_prefix("pub mod ").and_then(|r| r.strip_suffix(" {")) {
            module = if m == "zone" { "zone::" } else { "csr::" };
        } else if l == "}" && !line.starts_with(' ') {
            module = "";
        }
        if let Some(rest) = l.strip_prefix("pub const ") {
            let name = rest.split(':').next().unwrap().trim();
            if name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                let full = format!("{module}{name}");
                assert!(
                    code.contains_key(full.as_str()),
                    "target.rs constant `{full}` is not checked against the doc"
                );
            }
        }
    }
}

#[test]
fn the_parser_reads_the_value_forms_the_doc_uses() {
    assert_eq!(parse_value("0x4C000"), Some(311296.0));
    assert_eq!(parse_value("1472 (simulator: any 1..=1472)"), Some(1472.0));
    assert_eq!(parse_value("1.33e9 (GC200)"), Some(1.33e9));
    assert_eq!(parse_value("16 KiB"), Some(16384.0));
    assert_eq!(parse_value("6: a worker issues"), Some(6.0));
    assert_eq!(parse_value("none"), None);
}
