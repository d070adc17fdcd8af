//! A few values kept per serving thread for reuse: the most recently made
//! stay, the oldest goes first. For values that are the same for many
//! requests and cost work or memory to make (a day's signing key, a
//! bucket's own scope), where a shared map would need a lock.

/// At most `cap` values, in the order they were made.
#[derive(Debug)]
pub struct Recent<T> {
    kept: Vec<T>,
    cap: usize,
}

impl<T: Clone> Recent<T> {
    pub const fn new(cap: usize) -> Recent<T> {
        Recent {
            kept: Vec::new(),
            cap,
        }
    }

    /// The kept value that `is`, else the one `make` makes (kept too, in
    /// place of the oldest when full); None if `make` makes none.
    pub fn get_or_make(
        &mut self,
        is: impl Fn(&T) -> bool,
        make: impl FnOnce() -> Option<T>,
    ) -> Option<T> {
        if let Some(v) = self.find(is) {
            return Some(v);
        }
        Some(self.keep(make()?))
    }

    /// [`Recent::get_or_make`] for a `make` that always makes one.
    pub fn get_or_insert_with(&mut self, is: impl Fn(&T) -> bool, make: impl FnOnce() -> T) -> T {
        match self.find(is) {
            Some(v) => v,
            None => self.keep(make()),
        }
    }

    fn find(&self, is: impl Fn(&T) -> bool) -> Option<T> {
        self.kept.iter().find(|v| is(v)).cloned()
    }

    fn keep(&mut self, v: T) -> T {
        if self.kept.len() >= self.cap.max(1) {
            self.kept.remove(0);
        }
        self.kept.push(v.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_goes_first_and_a_value_not_made_is_not_kept() {
        let mut r = Recent::new(2);
        let mut made = 0;
        let mut get = |r: &mut Recent<u32>, n: u32| {
            r.get_or_make(
                |v| *v == n,
                || {
                    made += 1;
                    (n != 0).then_some(n)
                },
            )
        };
        assert_eq!(get(&mut r, 1), Some(1));
        assert_eq!(get(&mut r, 2), Some(2));
        assert_eq!(get(&mut r, 1), Some(1));
        assert_eq!(get(&mut r, 0), None);
        assert_eq!(get(&mut r, 3), Some(3));
        // Kept: 2 and 3 (1, the oldest made, went; 0 was never kept).
        assert_eq!(get(&mut r, 2), Some(2));
        assert_eq!(made, 4);
        assert_eq!(r.get_or_insert_with(|v| *v == 3, || 9), 3);
        assert_eq!(r.get_or_insert_with(|v| *v == 4, || 4), 4);
        // Kept: 3 and 4 (2 went).
        assert_eq!(r.get_or_insert_with(|v| *v == 3, || 9), 3);
        assert_eq!(r.get_or_insert_with(|v| *v == 2, || 7), 7);
    }
}
