//! Integer inputs as token ids, and the embedding lookup `Gather(table, ids)` (BERT's word
//! embeddings). The graph IR has no integers, so an integer input read only by `Gather`s of
//! constant tables is declared as its one-hot rows (`one_hot` in the model text: the host writes
//! them from the ids given to `run`, `crate::ids`), and each lookup is the matmul of the rows
//! with the table: one product of 1 and the table's value per output, exact in f16.

use super::*;

impl Lower<'_, '_> {
    /// The vocabulary size of integer input `name` when every node that reads it is a `Gather`
    /// (axis 0) of a constant `[V, D]` initializer by it, all with the same `V`; `None` when no
    /// node looks it up (its values are read: an attention mask, `masks.rs`). Both at once are
    /// refused.
    pub(super) fn ids_width(&self, g: &GraphProto, name: &str, at: &str) -> Result<Option<u64>, String> {
        let mut widths = BTreeSet::new();
        let mut others = Vec::new();
        for n in g.node.iter().filter(|n| n.input.iter().any(|i| i == name)) {
            let table = n.input.first().and_then(|t| self.pending.get(t)).filter(|t| t.dims.len() == 2);
            let axis = Attrs(&n.attribute).int("axis").unwrap_or(0);
            match table {
                Some(t)
                    if n.op_type == "Gather" && n.input.get(1).is_some_and(|i| i == name) && axis == 0 =>
                {
                    widths.insert(t.dims[0].max(0) as u64);
                }
                _ => others.push(n),
            }
        }
        match (widths.len(), others.first()) {
            (0, _) => Ok(None),
            (1, None) => Ok(widths.first().copied().filter(|w| *w > 0)),
            (1, Some(n)) => Err(format!(
                "{at}: read by node `{}` ({}) and by embedding lookups: an integer input is supported as token ids \
                 that only Gathers (axis 0) of constant [rows, width] tables read, or as values no lookup reads",
                n.name, n.op_type
            )),
            _ => Err(format!(
                "{at}: looked up in tables of {widths:?} rows: one vocabulary per ids input is supported"
            )),
        }
    }

    /// Declare integer input `name` of `shape` as its one-hot rows; the value they hold.
    pub(super) fn ids_input(&mut self, name: &str, shape: &[u64], width: u64) -> Run {
        self.emit.ids_input(name, shape, width);
        let mut full = shape.to_vec();
        full.push(width);
        let held = strip(&full);
        let t = if held != full {
            self.write_view(name, "reshape", &held, &format!("{name}_held"))
        } else {
            name.to_string()
        };
        self.ids.insert(name.to_string());
        Run { t, shape: full, e: Rc::new(Expr::X), prov: None }
    }

    /// `Gather(table, ids)` with a constant table and the rows of an ids input: their matmul.
    pub(super) fn lookup(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let (Some(Some(Val::C(table))), Some(Some(Val::R(rows)))) = (ins.first(), ins.get(1)) else {
            return Err(format!("{at}: expected a constant table and computed indices"));
        };
        if !node.input.get(1).is_some_and(|i| self.ids.contains(i)) || attrs.int("axis").unwrap_or(0) != 0 {
            return Err(format!(
                "{at}: a Gather of a constant by computed indices is supported as an embedding lookup: axis 0, \
                 indices an integer graph input (token ids)"
            ));
        }
        if table.shape.len() != 2 || Some(&table.shape[0]) != rows.shape.last() {
            return Err(format!(
                "{at}: a table of shape {:?} for ids of {:?} rows",
                table.shape,
                rows.shape.last()
            ));
        }
        let out = self.out_name(node);
        let (t, shape) = self.matmul(Val::R(rows.clone()), Val::C(table.clone()), 1.0, &out, at)?;
        self.run(node, t, shape);
        Ok(())
    }
}
