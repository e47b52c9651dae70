//! The statistics `pinring bench --repeat N` reports per point: the median and the range of the
//! runs' GB/s, their spread, and whether that spread is too wide to quote the median.

/// A point whose spread `(max - min) / median` exceeds this is flagged (`!`): the runs disagree
/// by more than 10% and the median should not be quoted without rerunning.
pub const SPREAD_FLAG: f64 = 0.10;

/// Median, minimum and maximum of a point's runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Number of runs.
    pub runs: usize,
    /// Median (the mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Stats {
    /// The statistics of `values`; `None` when there are none (or one is NaN).
    pub fn of(values: &[f64]) -> Option<Stats> {
        if values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Stats {
            runs: n,
            median,
            min,
            max,
        })
    }

    /// `(max - min) / median`; `None` when the median is not positive (a ratio to nothing).
    pub fn spread(&self) -> Option<f64> {
        (self.median > 0.0).then(|| (self.max - self.min) / self.median)
    }

    /// Whether the spread exceeds [`SPREAD_FLAG`]. A point without a spread (median 0) is
    /// flagged too: it cannot be quoted either.
    pub fn flagged(&self) -> bool {
        self.spread().is_none_or(|s| s > SPREAD_FLAG)
    }
}

/// The median of `values` (`None` when empty).
pub fn median(values: &[f64]) -> Option<f64> {
    Stats::of(values).map(|s| s.median)
}

/// The most frequent of `values`; a tie goes to the one seen first. `None` when empty.
pub fn most_common<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let values: Vec<&str> = values.into_iter().collect();
    let mut best: Option<(&str, usize)> = None;
    for &v in &values {
        let count = values.iter().filter(|&&w| w == v).count();
        if best.is_none_or(|(_, c)| count > c) {
            best = Some((v, count));
        }
    }
    best.map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_value_whatever_the_order() {
        let s = Stats::of(&[44.5, 36.3, 44.1]).unwrap();
        assert_eq!(s.runs, 3);
        assert_eq!(s.median, 44.1);
        assert_eq!((s.min, s.max), (36.3, 44.5));
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_two_middle_values() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[10.0, 20.0]), Some(15.0));
        let s = Stats::of(&[30.0, 10.0, 40.0, 20.0, 60.0, 50.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (35.0, 10.0, 60.0));
    }

    #[test]
    fn no_values_or_a_nan_have_no_statistics() {
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(median(&[]), None);
        assert_eq!(Stats::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn the_spread_is_the_range_over_the_median() {
        let s = Stats::of(&[40.0, 50.0, 45.0]).unwrap();
        assert_eq!(s.spread(), Some(10.0 / 45.0));
        // One run: no spread at all.
        assert_eq!(Stats::of(&[12.5]).unwrap().spread(), Some(0.0));
        // A median of zero has no spread to speak of.
        assert_eq!(Stats::of(&[0.0, 0.0, 1.0]).unwrap().spread(), None);
    }

    #[test]
    fn a_point_is_flagged_only_when_its_spread_exceeds_ten_percent() {
        // Exactly 10%: (100 - 90) / 100.
        let at = Stats::of(&[90.0, 100.0, 100.0]).unwrap();
        assert_eq!(at.spread(), Some(0.1));
        assert!(!at.flagged());
        // 11%: (101 - 90) / 100.
        let over = Stats::of(&[90.0, 100.0, 101.0]).unwrap();
        assert_eq!(over.spread(), Some(0.11));
        assert!(over.flagged());
        // The slow mode of the docs: 36.3 among 44s is a 19% spread.
        assert!(Stats::of(&[36.3, 44.1, 44.5]).unwrap().flagged());
        assert!(!Stats::of(&[44.0]).unwrap().flagged());
        // Nothing moved: cannot be quoted.
        assert!(Stats::of(&[0.0, 0.0]).unwrap().flagged());
    }

    #[test]
    fn the_most_common_value_wins_and_a_tie_goes_to_the_first_seen() {
        assert_eq!(most_common(["upload", "loaders", "upload"]), Some("upload"));
        assert_eq!(
            most_common(["loaders", "upload", "upload", "loaders"]),
            Some("loaders")
        );
        assert_eq!(most_common(["balanced"]), Some("balanced"));
        assert_eq!(most_common(Vec::<&str>::new()), None);
    }
}
