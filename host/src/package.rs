//! Application packages: assemble the sections, and read them back with every check of
//! `docs/format.md` before anything reaches a device.

use ipu_core::target::{in_tile_memory, EXEC_REGION_END, TILE_MEM_BASE};
use ipu_schema::{
    decode, encode, read_container, write_container, Binding, BuildInfo, Direction, HostExchange,
    PlanSummary, SectionKind, Symbol, TileImage, SEG_DATA, SEG_EXEC, SEG_ZERO,
};

/// Check that the slices of `b` cover every byte of the tensor, exactly once when `exact`.
/// A slice whose rows are consecutive in the tensor counts as one byte range; only strided slices
/// are materialised row by row, after their bytes are known to be bounded by the tensor size
/// (times the tile count for replicated inputs), so a hostile package cannot make this allocate.
/// A replicated input (an operand broadcast over leading axes is read once per output row) may
/// hold at most what the tiles' memory holds.
fn coverage(b: &Binding, exact: bool, tile_count: u32) -> Result<(), PackageError> {
    let size = b.bytes();
    let bytes = |s: &&ipu_schema::Slice| (s.rows as u64).saturating_mul(s.row_bytes as u64);
    let contiguous = |s: &&ipu_schema::Slice| s.tensor_stride == s.row_bytes as u64 || s.rows <= 1;
    let total = b.slices.iter().fold(0u64, |t, s| t.saturating_add(bytes(&s)));
    let strided = b.slices.iter().filter(|s| !contiguous(s)).fold(0u64, |t, s| t.saturating_add(bytes(&s)));
    let memory = tile_count as u64 * ipu_core::target::TILE_MEM_SIZE as u64;
    let (limit, strided_limit) =
        if exact { (size, size) } else { (memory.max(size), size.saturating_mul(tile_count as u64)) };
    let what = |msg: String| PackageError::Invalid(format!("binding `{}`: {msg}", b.name));
    if total > limit {
        return Err(what(format!("slices hold {total} bytes, more than the {limit} the tensor allows")));
    }
    if strided > strided_limit {
        return Err(what(format!(
            "strided slices hold {strided} bytes, more than the {strided_limit} the tensor allows"
        )));
    }
    // Every slice's rows, as granules: the largest unit every offset, length and stride is a
    // multiple of (a tiled f16 tensor read column-wise has millions of 2-byte rows).
    let ranges = |s: &ipu_schema::Slice| {
        let rows = if contiguous(&s) { 1 } else { s.rows as u64 };
        let len = if contiguous(&s) { bytes(&s) } else { s.row_bytes as u64 };
        let (offset, stride) = (s.tensor_offset, s.tensor_stride);
        (0..rows).map(move |r| (offset + r * stride, len))
    };
    let used = b.slices.iter().filter(|s| s.row_bytes != 0);
    let granule = used.clone().fold(size, |g, s| {
        let g = gcd(gcd(g, s.tensor_offset), s.row_bytes as u64);
        if contiguous(&s) {
            g
        } else {
            gcd(g, s.tensor_stride)
        }
    });
    let granules = size / granule.max(1);
    let (gap, overlap) = if size == 0 {
        (None, None)
    } else if granules <= MAX_BITMAP_GRANULES {
        let mut map = Granules::new(granules, exact);
        for s in used {
            for (start, len) in ranges(s) {
                map.mark(start / granule, len / granule);
            }
        }
        let scale = |(a, z): (u64, u64)| (a * granule, z * granule);
        (map.first_gap().map(scale), map.first_overlap().map(scale))
    } else {
        let mut rows: Vec<(u64, u64)> = used.flat_map(|s| ranges(s).map(|(a, len)| (a, a + len))).collect();
        sort_by_start(&mut rows, size);
        sorted_gap_and_overlap(&rows, size)
    };
    // The lower of the two is reported (as a sweep in tensor order meets it first).
    let overlap = overlap.filter(|_| exact);
    match (gap, overlap) {
        (Some((a, z)), o) if o.is_none_or(|o| a < o.0) => {
            Err(what(format!("bytes {a}..{z} of {size} are not covered by any slice")))
        }
        (_, Some((a, z))) => Err(what(format!("bytes {a}..{z} are read by more than one slice"))),
        _ => Ok(()),
    }
}

/// Tensors of up to this many granules are checked on a bitmap (128 MiB at most); larger ones
/// (only a hostile package's) by sorting their rows.
const MAX_BITMAP_GRANULES: u64 = 1 << 30;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Which granules of a tensor some slice reads, and (when overlaps matter) which two read.
struct Granules {
    len: u64,
    once: Vec<u64>,
    twice: Vec<u64>,
}

impl Granules {
    fn new(len: u64, overlaps: bool) -> Self {
        let words = len.div_ceil(64) as usize;
        Granules { len, once: vec![0; words], twice: if overlaps { vec![0; words] } else { Vec::new() } }
    }

    /// Granules `start..start+len` are read (the caller has bounded them by the tensor).
    fn mark(&mut self, start: u64, len: u64) {
        let end = start + len;
        let mut g = start;
        while g < end {
            let (w, bit) = ((g / 64) as usize, g % 64);
            let n = (64 - bit).min(end - g);
            let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << bit };
            if !self.twice.is_empty() {
                self.twice[w] |= self.once[w] & mask;
            }
            self.once[w] |= mask;
            g += n;
        }
    }

    /// The first run of granules in `map` whose bit is `set`, as `(start, end)`.
    fn first_run(map: &[u64], len: u64, set: bool) -> Option<(u64, u64)> {
        let word = |w: u64| if set { w } else { !w };
        let start = map
            .iter()
            .enumerate()
            .find(|(_, w)| word(**w) != 0)
            .map(|(i, w)| i as u64 * 64 + word(*w).trailing_zeros() as u64)?;
        if start >= len {
            return None;
        }
        let mut end = start;
        while end < len && ((map[(end / 64) as usize] >> (end % 64)) & 1 == 1) == set {
            end += 1;
        }
        Some((start, end))
    }

    fn first_gap(&self) -> Option<(u64, u64)> {
        Self::first_run(&self.once, self.len, false)
    }

    fn first_overlap(&self) -> Option<(u64, u64)> {
        Self::first_run(&self.twice, self.len, true)
    }
}

/// A byte range `(start, end)`.
type Span = (u64, u64);

/// The first uncovered and the first doubly covered byte ranges of byte ranges sorted by start.
fn sorted_gap_and_overlap(rows: &[(u64, u64)], size: u64) -> (Option<Span>, Option<Span>) {
    let (mut covered, mut overlap) = (0u64, None);
    for &(start, end) in rows {
        if start > covered {
            return (Some((covered, start)), overlap);
        }
        if start < covered && overlap.is_none() {
            overlap = Some((start, covered.min(end)));
        }
        covered = covered.max(end);
    }
    ((covered < size).then_some((covered, size)), overlap)
}

/// Sorts byte ranges `(start, end)` within `0..size`: bucketed by start (as many buckets as
/// ranges, each `size / n` bytes wide), then each bucket sorted. Linear for ranges spread over
/// the tensor, as a tiled tensor's rows are; `n log n` at worst, when they crowd one bucket.
fn sort_by_start(rows: &mut Vec<(u64, u64)>, size: u64) {
    let n = rows.len();
    if n < 2 {
        return;
    }
    let width = size.div_ceil(n as u64).max(1);
    let bucket = |start: u64| ((start / width) as usize).min(n - 1);
    let mut first = vec![0usize; n + 1];
    for r in rows.iter() {
        first[bucket(r.0) + 1] += 1;
    }
    for b in 0..n {
        first[b + 1] += first[b];
    }
    let mut next = first.clone();
    let mut sorted = vec![(0u64, 0u64); n];
    for r in rows.iter() {
        let b = bucket(r.0);
        sorted[next[b]] = *r;
        next[b] += 1;
    }
    for b in 0..n {
        sorted[first[b]..first[b + 1]].sort_unstable();
    }
    *rows = sorted;
}

/// A decoded, validated package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    /// Tiles of the target.
    pub tile_count: u32,
    /// One image per tile, in tile order.
    pub tiles: Vec<TileImage>,
    /// Configuration register writes.
    pub config: Vec<(u32, u32)>,
    /// Tensor bindings.
    pub bindings: Vec<Binding>,
    /// Host exchange.
    pub host: HostExchange,
    /// Symbols.
    pub symbols: Vec<Symbol>,
    /// Build information.
    pub info: BuildInfo,
    /// Plan figures.
    pub plan: PlanSummary,
}

/// Why a package is rejected.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// The container (header, table, checksums).
    #[error("{0}")]
    Container(ipu_schema::ContainerError),
    /// A section body does not decode.
    #[error("section {0}: body does not decode ({1})")]
    Decode(&'static str, String),
    /// A required section is missing.
    #[error("section {0} is missing")]
    Missing(&'static str),
    /// A semantic check failed.
    #[error("{0}")]
    Invalid(String),
}

impl Package {
    /// Serialise (deterministic).
    pub fn to_bytes(&self) -> Vec<u8> {
        let bodies = vec![
            (SectionKind::TileImages, encode(&ipu_schema::share_images(&self.tiles))),
            (SectionKind::ConfigWrites, encode(&self.config)),
            (SectionKind::Bindings, encode(&self.bindings)),
            (SectionKind::HostExchange, encode(&self.host)),
            (SectionKind::Symbols, encode(&self.symbols)),
            (SectionKind::BuildInfo, encode(&self.info)),
            (SectionKind::Plan, encode(&self.plan)),
        ];
        write_container(self.tile_count, &bodies)
    }

    /// Parse and validate.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PackageError> {
        let (header, sections) = read_container(bytes).map_err(PackageError::Container)?;
        let body = |k: SectionKind| {
            sections
                .iter()
                .find(|(kind, _)| *kind == k)
                .map(|(_, b)| *b)
                .ok_or(PackageError::Missing(k.name()))
        };
        fn dec<'a, T: serde::Deserialize<'a>>(k: SectionKind, b: &'a [u8]) -> Result<T, PackageError> {
            decode(b).map_err(|e| PackageError::Decode(k.name(), e.to_string()))
        }
        let shared: Vec<ipu_schema::SharedImage> =
            dec(SectionKind::TileImages, body(SectionKind::TileImages)?)?;
        let tiles = ipu_schema::unshare_images(shared).ok_or_else(|| {
            PackageError::Invalid(
                "tile images: each tile must be listed once, ascending within an image, and images ordered by their first tile"
                    .into(),
            )
        })?;
        let p = Package {
            tile_count: header.tile_count.get(),
            tiles,
            config: dec(SectionKind::ConfigWrites, body(SectionKind::ConfigWrites)?)?,
            bindings: dec(SectionKind::Bindings, body(SectionKind::Bindings)?)?,
            host: dec(SectionKind::HostExchange, body(SectionKind::HostExchange)?)?,
            symbols: dec(SectionKind::Symbols, body(SectionKind::Symbols)?)?,
            info: dec(SectionKind::BuildInfo, body(SectionKind::BuildInfo)?)?,
            plan: dec(SectionKind::Plan, body(SectionKind::Plan)?)?,
        };
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result<(), PackageError> {
        let bad = |s: String| Err(PackageError::Invalid(s));
        if self.tiles.len() != self.tile_count as usize {
            return bad(format!("{} tile images for a {}-tile target", self.tiles.len(), self.tile_count));
        }
        // Tiles that share an image (as read from the file) share its check.
        let mut checked: std::collections::BTreeSet<(*const Vec<ipu_schema::Segment>, u32)> =
            std::collections::BTreeSet::new();
        for (i, img) in self.tiles.iter().enumerate() {
            let t = img.tile;
            if t as usize != i {
                return bad(format!(
                    "tile image {i} is for tile {t} (images must be in tile order, one per tile)"
                ));
            }
            if !checked.insert((std::sync::Arc::as_ptr(&img.segments), img.entry)) {
                continue;
            }
            let mut prev_end = 0u64;
            let mut entry_ok = false;
            for (k, s) in img.segments.iter().enumerate() {
                let what = format!("tile {t} segment {k} at {:#x}", s.addr);
                let zero = s.flags & SEG_ZERO != 0;
                if s.flags & !(SEG_EXEC | SEG_DATA | SEG_ZERO) != 0
                    || (s.flags & SEG_EXEC != 0) == (s.flags & SEG_DATA != 0)
                {
                    return bad(format!("{what}: invalid flags {:#x}", s.flags));
                }
                if zero && (s.flags & SEG_EXEC != 0 || !s.bytes.is_empty()) {
                    return bad(format!("{what}: zero-filled segments are data without bytes"));
                }
                if !zero && s.bytes.len() != s.len as usize {
                    return bad(format!("{what}: length {} but {} bytes", s.len, s.bytes.len()));
                }
                if !in_tile_memory(s.addr, s.len) {
                    return bad(format!("{what}: {} bytes outside tile memory 0x4c000..0xe8000", s.len));
                }
                if s.flags & SEG_EXEC != 0 && s.addr as u64 + s.len as u64 > EXEC_REGION_END as u64 {
                    return bad(format!("{what}: code outside the executable region 0x4c000..0x80000"));
                }
                if (s.addr as u64) < prev_end {
                    return bad(format!(
                        "{what}: overlaps the previous segment (segments must be sorted and disjoint)"
                    ));
                }
                prev_end = s.addr as u64 + s.len as u64;
                if s.flags & SEG_EXEC != 0 && (s.addr..s.addr + s.len).contains(&img.entry) {
                    entry_ok = true;
                }
            }
            if !entry_ok {
                return bad(format!("tile {t}: entry {:#x} is not inside a code segment", img.entry));
            }
        }
        for b in &self.bindings {
            let size = b.bytes();
            if b.shape.is_empty() || b.shape.contains(&0) {
                return bad(format!("binding `{}`: empty shape", b.name));
            }
            for (k, s) in b.slices.iter().enumerate() {
                let what = format!("binding `{}` slice {k}", b.name);
                if s.tile as u32 >= self.tile_count {
                    return bad(format!("{what}: tile {} out of range", s.tile));
                }
                if s.rows == 0 || s.row_bytes == 0 {
                    continue;
                }
                let last_tile =
                    s.addr as u64 + (s.rows as u64 - 1) * s.tile_stride as u64 + s.row_bytes as u64;
                if s.addr < TILE_MEM_BASE || last_tile > ipu_core::target::TILE_MEM_END as u64 {
                    return bad(format!(
                        "{what}: tile range {:#x}..{last_tile:#x} outside tile memory",
                        s.addr
                    ));
                }
                let last = s.tensor_offset + (s.rows as u64 - 1) * s.tensor_stride + s.row_bytes as u64;
                if last > size {
                    return bad(format!("{what}: reaches byte {last} of a {size}-byte tensor"));
                }
            }
        }
        self.validate_contract()?;
        if !in_tile_memory(self.host.mailbox, 4) || !self.host.mailbox.is_multiple_of(4) {
            return bad(format!("host mailbox {:#x} not a word of tile memory", self.host.mailbox));
        }
        if !self.host.calls.iter().any(|c| c.name == "run") {
            return bad("host exchange has no `run` call".into());
        }
        if self.plan.memory.len() != self.tile_count as usize {
            return bad("plan memory table does not cover every tile".into());
        }
        if let Some(p) = &self.plan.profile {
            self.validate_profile(p)?;
        }
        Ok(())
    }

    /// The package's output contract (docs/format.md "Bindings"): its input and output bindings
    /// are exactly the model's inputs and outputs (name, dtype, shape, scale), every input byte is
    /// written by at least one slice, and every output byte is read by exactly one. A package that
    /// dropped or shifted an output binding would otherwise compare nothing and pass.
    fn validate_contract(&self) -> Result<(), PackageError> {
        let bad = |s: String| Err(PackageError::Invalid(s));
        let g = match crate::model::parse("<package model>", &self.info.model_source) {
            Ok(g) => g,
            Err(e) => return bad(format!("build info: the model source does not parse: {e}")),
        };
        // Every input and param whose value reaches an output is bound; one that reaches none
        // (read by no op, or only by ops whose results reach no output) may be left unbound, and
        // is checked like the others where it is bound. Outputs: exactly the model's.
        let (inputs, params) = (&g.inputs, &g.params);
        let needed = g.needed();
        let dirs = [(Direction::Input, inputs), (Direction::Param, params), (Direction::Output, &g.outputs)];
        for (dir, all) in dirs {
            let word = match dir {
                Direction::Input => "input",
                Direction::Param => "param",
                Direction::Output => "output",
            };
            let bound: Vec<&Binding> = self.bindings.iter().filter(|b| b.direction == dir).collect();
            let is_bound =
                |id: &ipu_core::graph::TensorId| bound.iter().any(|b| b.name == g.tensor(*id).name);
            let ids: Vec<ipu_core::graph::TensorId> =
                all.iter().copied().filter(|id| needed[id.0 as usize] || is_bound(id)).collect();
            let unknown = bound.iter().any(|b| !ids.iter().any(|id| g.tensor(*id).name == b.name));
            if bound.len() != ids.len() {
                let names: Vec<&str> = bound.iter().map(|b| b.name.as_str()).collect();
                let want: Vec<&str> = ids.iter().map(|id| g.tensor(*id).name.as_str()).collect();
                return bad(format!("the model has {word}s {want:?} but the package binds {names:?}"));
            }
            if let Some(id) = ids.iter().find(|id| !is_bound(id)) {
                return bad(format!("model {word} `{}` has no {word} binding", g.tensor(*id).name));
            }
            if unknown {
                let names: Vec<&str> = bound.iter().map(|b| b.name.as_str()).collect();
                let want: Vec<&str> = ids.iter().map(|id| g.tensor(*id).name.as_str()).collect();
                return bad(format!("the model has {word}s {want:?} but the package binds {names:?}"));
            }
            for id in &ids {
                let t = g.tensor(*id);
                let Some(b) = bound.iter().find(|b| b.name == t.name) else {
                    return bad(format!("model {word} `{}` has no {word} binding", t.name));
                };
                if b.dtype != t.dtype || b.shape != t.shape || b.scale != t.scale {
                    return bad(format!(
                        "{word} binding `{}` is {} {:?} scale {} but the model says {} {:?} scale {}",
                        b.name,
                        b.dtype.name(),
                        b.shape,
                        b.scale,
                        t.dtype.name(),
                        t.shape,
                        t.scale
                    ));
                }
                coverage(b, dir == Direction::Output, self.tile_count)?;
            }
        }
        Ok(())
    }

    /// The profile plan: one entry per tile, stamp buffers of whole words in data memory outside
    /// code, names for every index (docs/format.md).
    fn validate_profile(&self, p: &ipu_schema::ProfilePlan) -> Result<(), PackageError> {
        let bad = |s: String| Err(PackageError::Invalid(s));
        if p.tiles.len() != self.tile_count as usize {
            return bad(format!("profile plan covers {} tiles of {}", p.tiles.len(), self.tile_count));
        }
        for (t, ts) in p.tiles.iter().enumerate() {
            let bytes = 4 * (ts.samples.len() as u64 + 1);
            let what = format!("profile plan tile {t}: stamp buffer {:#x}", ts.buffer);
            if bytes > u32::MAX as u64
                || !in_tile_memory(ts.buffer, bytes as u32)
                || !ts.buffer.is_multiple_of(4)
            {
                return bad(format!("{what}: {bytes} bytes not whole words of tile memory"));
            }
            let end = ts.buffer as u64 + bytes;
            let hits_code = self.tiles[t].segments.iter().any(|s| {
                s.flags & SEG_EXEC != 0
                    && (s.addr as u64) < end
                    && (ts.buffer as u64) < s.addr as u64 + s.len as u64
            });
            if hits_code {
                return bad(format!("{what}: overlaps code"));
            }
            for (i, sp) in ts.samples.iter().enumerate() {
                if sp.phase as usize >= p.phases.len()
                    || (sp.kernel != ipu_schema::NO_KERNEL && sp.kernel as usize >= p.kernels.len())
                {
                    return bad(format!(
                        "profile plan tile {t} sample {i}: phase or kernel index out of range"
                    ));
                }
            }
        }
        Ok(())
    }

    /// `len` bytes of tile `tile`'s image at `addr` (zero-filled segments read as zeros), if one
    /// segment holds them all.
    pub fn image_bytes(&self, tile: u16, addr: u32, len: u32) -> Option<std::borrow::Cow<'_, [u8]>> {
        let img = self.tiles.get(tile as usize)?;
        let s = img
            .segments
            .iter()
            .find(|s| s.addr <= addr && addr as u64 + len as u64 <= s.addr as u64 + s.len as u64)?;
        let o = (addr - s.addr) as usize;
        Some(if s.flags & SEG_ZERO != 0 {
            std::borrow::Cow::Owned(vec![0; len as usize])
        } else {
            std::borrow::Cow::Borrowed(&s.bytes[o..o + len as usize])
        })
    }

    /// The `run` call.
    pub fn run_call(&self) -> &ipu_schema::Call {
        self.host.calls.iter().find(|c| c.name == "run").expect("validated")
    }
}

#[cfg(test)]
mod tests {
    use super::{sort_by_start, sorted_gap_and_overlap, Granules};

    /// A xorshift generator of numbers below its argument.
    fn below(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut z = seed;
        move |m| {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z % m
        }
    }

    /// The bitmap and the sorted sweep find the same first gap and an overlap starting at the
    /// same byte, on random sets of ranges with and without gaps and overlaps.
    #[test]
    fn bitmap_and_sorted_sweep_agree() {
        let mut next = below(0x2545_F491_4F6C_DD1D);
        let (mut gaps, mut overlaps) = (0, 0);
        for case in 0..400 {
            let size = 1 + next(300);
            // Tiles the tensor, then drops or widens a few pieces.
            let mut rows = Vec::new();
            let mut at = 0;
            while at < size {
                let len = (1 + next(40)).min(size - at);
                if next(20) != 0 {
                    rows.push((at, at + len));
                }
                if next(15) == 0 {
                    rows.push((at, (at + len + next(30)).min(size)));
                }
                at += len;
            }
            let mut map = Granules::new(size, true);
            for &(a, e) in &rows {
                map.mark(a, e - a);
            }
            let mut sorted = rows.clone();
            sort_by_start(&mut sorted, size);
            let (gap, overlap) = sorted_gap_and_overlap(&sorted, size);
            assert_eq!(map.first_gap(), gap, "case {case}: {rows:?}");
            if gap.is_none() {
                assert_eq!(map.first_overlap().map(|o| o.0), overlap.map(|o| o.0), "case {case}: {rows:?}");
            }
            gaps += gap.is_some() as u32;
            overlaps += overlap.is_some() as u32;
        }
        assert!(gaps > 20 && overlaps > 20, "{gaps} gaps, {overlaps} overlaps");
    }

    /// The bucketed sort gives what a plain sort gives, for ranges spread over the tensor, crowded
    /// into one bucket, repeated, and at the tensor's last byte.
    #[test]
    fn bucketed_sort_is_a_sort() {
        let mut next = below(0x9E37_79B9_7F4A_7C15);
        let size = 1 << 20;
        for crowd in [size, 64, 1] {
            let mut rows: Vec<(u64, u64)> = (0..5000)
                .map(|_| {
                    let s = next(crowd).min(size - 1);
                    (s, s + 1 + next(size - s))
                })
                .collect();
            rows.push((size - 1, size));
            rows.push(rows[7]);
            let mut want = rows.clone();
            want.sort_unstable();
            sort_by_start(&mut rows, size);
            assert_eq!(rows, want, "crowd {crowd}");
        }
    }
}
