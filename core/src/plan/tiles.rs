//! The tiles' programs of a plan, shared where they are the same.
//!
//! At whole-chip scale most tiles run one of a few programs: the 92 tiles of an attention head
//! differ only in which rows the host writes to them, idle tiles run nothing. A planner that
//! knows this plans each *class* of tiles once and gives every tile of the class the same program
//! ([`Tiles::shared`]); later passes that change a tile's program copy it first (copy on write,
//! [`Tiles::get_mut`]), and passes that do the same to every program do it once per distinct
//! program ([`Tiles::for_each_distinct`]), so the sharing survives to code generation and
//! linking, which also work once per distinct program. Planning, emitting and linking then cost
//! per class, not per tile; the package is the same bytes either way.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;

use super::TilePlan;

/// One program per tile, tiles with the same program sharing it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tiles {
    plans: Vec<Arc<TilePlan>>,
}

impl Tiles {
    /// `n` tiles with empty programs (all sharing one).
    pub fn empty(n: usize) -> Self {
        let e = Arc::new(TilePlan::default());
        Tiles { plans: (0..n).map(|_| e.clone()).collect() }
    }

    /// Tiles whose program is `classes[class_of[t]]`.
    pub fn shared(classes: Vec<TilePlan>, class_of: &[usize]) -> Self {
        let classes: Vec<Arc<TilePlan>> = classes.into_iter().map(Arc::new).collect();
        Tiles { plans: class_of.iter().map(|&c| classes[c].clone()).collect() }
    }

    /// Number of tiles.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Whether there are no tiles.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Tile `t`'s program, to change: copied first if other tiles share it.
    pub fn get_mut(&mut self, t: usize) -> &mut TilePlan {
        Arc::make_mut(&mut self.plans[t])
    }

    /// Give tile `t` the program `p`.
    pub fn set(&mut self, t: usize, p: TilePlan) {
        self.plans[t] = Arc::new(p);
    }

    /// Tile `t`'s program as shared (`Arc::ptr_eq` tells tiles that share one).
    pub fn arc(&self, t: usize) -> &Arc<TilePlan> {
        &self.plans[t]
    }

    /// Every tile's program, in tile order.
    pub fn iter(&self) -> impl Iterator<Item = &TilePlan> {
        self.plans.iter().map(|p| &**p)
    }

    /// The programs as shared, in tile order (for moving them into another plan).
    pub fn into_arcs(self) -> Vec<Arc<TilePlan>> {
        self.plans
    }

    /// Give tile `t` the shared program `p`.
    pub fn set_arc(&mut self, t: usize, p: Arc<TilePlan>) {
        self.plans[t] = p;
    }

    /// Every tile's program to change, in tile order (each copied first if shared: use
    /// [`Tiles::for_each_distinct`] for a change that is the same on every tile).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut TilePlan> {
        self.plans.iter_mut().map(Arc::make_mut)
    }

    /// The distinct programs, in order of their first tile: `(first tile, program)`.
    pub fn distinct(&self) -> Vec<(usize, &TilePlan)> {
        let mut seen: BTreeMap<*const TilePlan, ()> = BTreeMap::new();
        let mut out = Vec::new();
        for (t, p) in self.plans.iter().enumerate() {
            if seen.insert(Arc::as_ptr(p), ()).is_none() {
                out.push((t, &**p));
            }
        }
        out
    }

    /// For each tile, the index of its program in [`Tiles::distinct`].
    pub fn class_of(&self) -> Vec<usize> {
        let mut index: BTreeMap<*const TilePlan, usize> = BTreeMap::new();
        self.plans
            .iter()
            .map(|p| {
                let n = index.len();
                *index.entry(Arc::as_ptr(p)).or_insert(n)
            })
            .collect()
    }

    /// Apply `f` once to each distinct program (`f` gets the tiles that have it, ascending),
    /// keeping those tiles sharing the result. What `f` does must not depend on which of them it
    /// is.
    pub fn for_each_distinct<E>(
        &mut self,
        mut f: impl FnMut(&[usize], &mut TilePlan) -> Result<(), E>,
    ) -> Result<(), E> {
        // The tiles of each distinct program, in order of their first tile.
        let mut group: BTreeMap<*const TilePlan, usize> = BTreeMap::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (t, p) in self.plans.iter().enumerate() {
            let n = groups.len();
            let g = *group.entry(Arc::as_ptr(p)).or_insert(n);
            if g == n {
                groups.push(Vec::new());
            }
            groups[g].push(t);
        }
        let empty = Arc::new(TilePlan::default());
        for tiles in groups {
            // The group's tiles give up their references, so the program is changed in place
            // (a program shared with no other owner is not copied).
            let mut shared = None;
            for &t in &tiles {
                let a = core::mem::replace(&mut self.plans[t], empty.clone());
                shared.get_or_insert(a);
            }
            let a = shared.expect("a group has a tile");
            let mut p = Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone());
            f(&tiles, &mut p)?;
            let new = Arc::new(p);
            for &t in &tiles {
                self.plans[t] = new.clone();
            }
        }
        Ok(())
    }
}

impl From<Vec<TilePlan>> for Tiles {
    fn from(v: Vec<TilePlan>) -> Self {
        Tiles { plans: v.into_iter().map(Arc::new).collect() }
    }
}

impl core::ops::Index<usize> for Tiles {
    type Output = TilePlan;
    fn index(&self, t: usize) -> &TilePlan {
        &self.plans[t]
    }
}

impl core::ops::IndexMut<usize> for Tiles {
    /// Copy on write: the tile's own program, copied first if other tiles share it.
    fn index_mut(&mut self, t: usize) -> &mut TilePlan {
        Arc::make_mut(&mut self.plans[t])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Step;

    fn plan(n: u32) -> TilePlan {
        TilePlan { buffers: Vec::new(), steps: alloc::vec![Step::Stamp(n)] }
    }

    /// A change made through one tile copies its program; a change made once per distinct program
    /// reaches every tile that shares it and keeps them sharing.
    #[test]
    fn copy_on_write_and_changes_per_distinct_program() {
        let mut t = Tiles::shared(alloc::vec![plan(0), plan(1)], &[0, 1, 0, 0]);
        assert_eq!(t.distinct().iter().map(|d| d.0).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(t.class_of(), [0, 1, 0, 0]);
        t[2].steps.push(Step::Sync);
        assert_eq!(t.distinct().len(), 3);
        assert_eq!(t[0].steps.len(), 1, "tile 0 kept its program");
        assert_eq!(t[2].steps.len(), 2);
        let mut visits = Vec::new();
        t.for_each_distinct(|tiles, p| {
            visits.push(tiles[0]);
            p.steps.push(Step::Sync);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(visits, [0, 1, 2], "once per distinct program, by first tile");
        assert_eq!(t.class_of(), [0, 1, 2, 0], "tiles 0 and 3 still share");
        assert_eq!(t[3].steps.len(), 2);
        assert_eq!(t[2].steps.len(), 3);
    }
}
