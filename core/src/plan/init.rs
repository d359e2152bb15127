//! A buffer's initial words, packed.
//!
//! A whole-chip plan holds tens of millions of descriptor words (SigLIP attention on 1,472 tiles:
//! 16.5 M, nearly all AMP descriptors). As [`Word`] values, an enum with an inline name, they took
//! 32 bytes each, half the build's memory; and the build's time was mostly the kernel zeroing
//! the pages that memory touched (docs/attention.md "Build time and memory"). Packed, a word is
//! its 32-bit value and, when it is an address, the index of its buffer's name in a table the
//! buffer carries (a launch's descriptor names two to four buffers): 8 bytes a word, 4 when every
//! word is a constant (parameter images). The buffer stays self-contained, so plans move and
//! merge buffers without a tile-wide symbol table.

use alloc::vec::Vec;

use super::{Sym, Word};

/// Initial 32-bit words of a buffer (`Sym` words are resolved by the linker); empty means
/// zero-filled.
///
/// Invariant: `tags` is empty exactly when no word is an address, otherwise it has one entry per
/// word. So equal word sequences built the same way compare equal (the build keys identical
/// tiles by their buffers).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Init {
    /// Each word's value: the constant, or the offset added to its buffer's address.
    values: Vec<u32>,
    /// Per word: 0 for a constant, else 1 + the index of its buffer's name in `names`.
    tags: Vec<u32>,
    /// The buffer names the address words use, in order of first use.
    names: Vec<Sym>,
}

impl Init {
    /// No words: a zero-filled buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Constant words only.
    pub fn consts(values: Vec<u32>) -> Self {
        Self { values, tags: Vec::new(), names: Vec::new() }
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no words (the buffer is zero-filled).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Word `i`.
    pub fn get(&self, i: usize) -> Option<Word> {
        let v = *self.values.get(i)?;
        Some(match self.tags.get(i).copied().unwrap_or(0) {
            0 => Word::Const(v),
            t => Word::Sym(self.names[t as usize - 1].clone(), v),
        })
    }

    /// The words in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Word> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below len"))
    }

    /// The tag of a name, adding it to the table (tables are short: a linear scan).
    fn tag_of(&mut self, name: &str) -> u32 {
        let i = match self.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.into());
                self.names.len() - 1
            }
        };
        i as u32 + 1
    }

    /// Append one word.
    pub fn push(&mut self, w: Word) {
        match w {
            Word::Const(v) => {
                if !self.tags.is_empty() {
                    self.tags.push(0);
                }
                self.values.push(v);
            }
            Word::Sym(name, v) => {
                let tag = self.tag_of(&name);
                if self.tags.is_empty() {
                    self.tags.resize(self.values.len(), 0);
                }
                self.tags.push(tag);
                self.values.push(v);
            }
        }
    }

    /// Append all of `other`'s words, its names mapped into this table.
    pub fn append(&mut self, other: &Init) {
        if other.tags.is_empty() {
            if !self.tags.is_empty() {
                self.tags.resize(self.values.len() + other.len(), 0);
            }
            self.values.extend_from_slice(&other.values);
            return;
        }
        let map: Vec<u32> = other.names.iter().map(|n| self.tag_of(n)).collect();
        if self.tags.is_empty() {
            self.tags.resize(self.values.len(), 0);
        }
        self.tags.extend(other.tags.iter().map(|&t| if t == 0 { 0 } else { map[t as usize - 1] }));
        self.values.extend_from_slice(&other.values);
    }

    /// Re-point address words by name: where `f(name)` gives `(new, delta)`, every word naming
    /// `name` names `new` instead, its offset raised by `delta`. Names that become equal share
    /// one entry of the table.
    pub fn rebase(&mut self, mut f: impl FnMut(&Sym) -> Option<(Sym, u32)>) {
        if self.tags.is_empty() {
            return;
        }
        let old = core::mem::take(&mut self.names);
        let mut map = Vec::with_capacity(old.len());
        let mut delta = Vec::with_capacity(old.len());
        for n in &old {
            let (new, d) = f(n).unwrap_or_else(|| (n.clone(), 0));
            map.push(self.tag_of(&new));
            delta.push(d);
        }
        for (t, v) in self.tags.iter_mut().zip(self.values.iter_mut()) {
            if *t != 0 {
                let i = *t as usize - 1;
                *v = v.wrapping_add(delta[i]);
                *t = map[i];
            }
        }
    }

    /// Rename address words' buffers (offsets unchanged).
    pub fn rename(&mut self, mut f: impl FnMut(&Sym) -> Sym) {
        self.rebase(|n| Some((f(n), 0)));
    }
}

impl From<Vec<Word>> for Init {
    fn from(words: Vec<Word>) -> Self {
        words.into_iter().collect()
    }
}

impl FromIterator<Word> for Init {
    fn from_iter<I: IntoIterator<Item = Word>>(words: I) -> Self {
        let mut init = Init::new();
        for w in words {
            init.push(w);
        }
        init
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn sym(n: &str, o: u32) -> Word {
        Word::Sym(n.into(), o)
    }

    #[test]
    fn words_come_back_in_order() {
        let words = vec![Word::Const(7), sym("C", 40), sym("A", 0), Word::Const(0), sym("C", 8)];
        let init = Init::from(words.clone());
        assert_eq!(init.len(), 5);
        assert_eq!(init.iter().collect::<Vec<_>>(), words);
        assert_eq!(init.names.len(), 2, "a name is stored once");
        assert_eq!(init.get(5), None);
    }

    #[test]
    fn constants_need_no_tags_and_the_form_is_canonical() {
        let c = Init::consts(vec![1, 2, 3]);
        assert!(c.tags.is_empty());
        assert_eq!(c, Init::from(vec![Word::Const(1), Word::Const(2), Word::Const(3)]));
        let mut a = Init::consts(vec![1]);
        a.push(sym("X", 4));
        a.push(Word::Const(9));
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![Word::Const(1), sym("X", 4), Word::Const(9)]);
        assert_eq!(a, Init::from(vec![Word::Const(1), sym("X", 4), Word::Const(9)]));
    }

    #[test]
    fn append_maps_names_into_the_table() {
        let mut a = Init::from(vec![sym("B", 1), Word::Const(2)]);
        a.append(&Init::from(vec![sym("A", 3), sym("B", 4)]));
        a.append(&Init::consts(vec![5]));
        let mut b = Init::consts(vec![6]);
        b.append(&a);
        let want =
            vec![Word::Const(6), sym("B", 1), Word::Const(2), sym("A", 3), sym("B", 4), Word::Const(5)];
        assert_eq!(b.iter().collect::<Vec<_>>(), want);
        assert_eq!(b, Init::from(want));
    }

    #[test]
    fn rebase_moves_offsets_and_merges_names() {
        let mut a = Init::from(vec![sym("t1", 8), sym("t2", 4), Word::Const(3), sym("X", 0)]);
        a.rebase(|n| match n.as_str() {
            "t1" => Some(("D".into(), 100)),
            "t2" => Some(("D".into(), 200)),
            _ => None,
        });
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            vec![sym("D", 108), sym("D", 204), Word::Const(3), sym("X", 0)]
        );
        assert_eq!(a.names.len(), 2);
        a.rename(|n| smol_str::format_smolstr!("g0_{n}"));
        assert_eq!(a.get(3), Some(sym("g0_X", 0)));
        assert_eq!(a.get(0), Some(sym("g0_D", 108)));
    }
}
