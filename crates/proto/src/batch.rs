//! The per-item contract of every batch call: one result per input item, in input order, and an item that is
//! invalid on its own (an oversized key) fails only its own slot without reaching the real call.
//!
//! [`split`] answers the invalid items at once and hands back the valid ones; [`Slots::fill`] puts the real
//! call's answers (one per valid item, in order) back in their input slots.

/// The results of a batch so far: the invalid items' errors in their slots, and where each valid item goes.
#[derive(Debug)]
pub struct Slots<T, E> {
    out: Vec<Option<Result<T, E>>>,
    valid: Vec<usize>,
}

/// Sorts a batch's checked items: an `Err` answers its own slot; the `Ok` values are returned in input order,
/// to be passed on to the real call.
pub fn split<V, T, E>(items: impl IntoIterator<Item = Result<V, E>>) -> (Slots<T, E>, Vec<V>) {
    let mut slots = Slots { out: Vec::new(), valid: Vec::new() };
    let mut values = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Ok(v) => {
                slots.valid.push(i);
                slots.out.push(None);
                values.push(v);
            }
            Err(e) => slots.out.push(Some(Err(e))),
        }
    }
    (slots, values)
}

impl<T, E> Slots<T, E> {
    /// The input positions of the valid items, in order.
    pub fn valid(&self) -> &[usize] {
        &self.valid
    }

    /// Puts `answers` (one per valid item, in order) in their slots; a valid item left without an answer (a
    /// call that returned too few) gets `missing()`.
    pub fn fill(
        mut self,
        answers: impl IntoIterator<Item = Result<T, E>>,
        missing: impl Fn() -> E,
    ) -> Vec<Result<T, E>> {
        for (&i, a) in self.valid.iter().zip(answers) {
            self.out[i] = Some(a);
        }
        self.out.into_iter().map(|r| r.unwrap_or_else(|| Err(missing()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_items_fail_their_own_slot_and_answers_return_in_input_order() {
        let items = [Ok("a"), Err("bad"), Ok("b"), Ok("c")];
        let (slots, valid) = split::<_, String, _>(items);
        assert_eq!(valid, ["a", "b", "c"]);
        assert_eq!(slots.valid(), [0, 2, 3]);
        let answers = valid.iter().map(|v| if *v == "b" { Err("no") } else { Ok(v.to_uppercase()) });
        let out = slots.fill(answers, || "missing");
        assert_eq!(out, [Ok("A".into()), Err("bad"), Err("no"), Ok("C".into())]);
        // Too few answers: the rest are reported missing, never dropped.
        let (slots, _) = split::<_, u8, &str>([Ok(1), Ok(2)]);
        assert_eq!(slots.fill([Ok(7)], || "missing"), [Ok(7), Err("missing")]);
    }
}
