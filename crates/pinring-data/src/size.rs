//! Byte sizes as they appear in config files and command-line flags.
//!
//! [`ByteSize`] accepts either a plain integer (bytes) or a string with a unit
//! such as `"4MiB"`, `"64 KiB"`, `"2MB"` and prints itself in binary units
//! (`"4.0 MiB"`).

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Units accepted by [`ByteSize`]'s parser, listed in error messages.
pub const ACCEPTED_UNITS: &str =
    "B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000); \
     a bare integer means bytes";

/// Errors from parsing a [`ByteSize`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// The text is not `<number><unit>`.
    #[error("invalid byte size {value:?}: expected a whole number followed by an optional unit; accepted units: {units}", units = ACCEPTED_UNITS)]
    Syntax {
        /// The text that failed to parse.
        value: String,
    },
    /// The unit is not one of [`ACCEPTED_UNITS`].
    #[error("invalid byte size {value:?}: unknown unit {unit:?}; accepted units: {units}", units = ACCEPTED_UNITS)]
    UnknownUnit {
        /// The text that failed to parse.
        value: String,
        /// The unit that was not recognised.
        unit: String,
    },
    /// The value does not fit in 64 bits.
    #[error("invalid byte size {value:?}: larger than {max} bytes; use a smaller value", max = u64::MAX)]
    Overflow {
        /// The text that failed to parse.
        value: String,
    },
    /// A negative integer was given.
    #[error("invalid byte size {value}: sizes cannot be negative")]
    Negative {
        /// The negative value.
        value: i64,
    },
}

/// A number of bytes.
///
/// Deserializes from an integer (bytes) or from a string such as `"4MiB"`,
/// `"64 KiB"`, `"512B"` or `"2MB"` (= 2 000 000). Serializes as an integer.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    bincode::Encode,
    bincode::Decode,
)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// One kibibyte (1024 bytes).
    pub const KIB: u64 = 1 << 10;
    /// One mebibyte.
    pub const MIB: u64 = 1 << 20;
    /// One gibibyte.
    pub const GIB: u64 = 1 << 30;
    /// One tebibyte.
    pub const TIB: u64 = 1 << 40;

    /// The number of bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl From<u64> for ByteSize {
    fn from(v: u64) -> Self {
        ByteSize(v)
    }
}

impl From<ByteSize> for u64 {
    fn from(v: ByteSize) -> Self {
        v.0
    }
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    let m = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => ByteSize::KIB,
        "m" | "mib" => ByteSize::MIB,
        "g" | "gib" => ByteSize::GIB,
        "t" | "tib" => ByteSize::TIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    Some(m)
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, rest) = t.split_at(digits_end);
        if num.is_empty() {
            return Err(SizeError::Syntax {
                value: s.to_string(),
            });
        }
        let unit = rest.trim();
        let mult = unit_multiplier(unit).ok_or_else(|| {
            if unit.chars().all(|c| c.is_ascii_alphabetic()) {
                SizeError::UnknownUnit {
                    value: s.to_string(),
                    unit: unit.to_string(),
                }
            } else {
                SizeError::Syntax {
                    value: s.to_string(),
                }
            }
        })?;
        let n: u64 = num.parse().map_err(|_| SizeError::Overflow {
            value: s.to_string(),
        })?;
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| SizeError::Overflow {
                value: s.to_string(),
            })
    }
}

impl fmt::Display for ByteSize {
    /// Human-readable, binary units with one decimal: `512 B`, `4.0 MiB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (ByteSize::TIB, "TiB"),
            (ByteSize::GIB, "GiB"),
            (ByteSize::MIB, "MiB"),
            (ByteSize::KIB, "KiB"),
        ];
        for (scale, name) in UNITS {
            if self.0 >= scale {
                return write!(f, "{:.1} {}", self.0 as f64 / scale as f64, name);
            }
        }
        write!(f, "{} B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

struct ByteSizeVisitor;

impl Visitor<'_> for ByteSizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a byte count (integer) or a size string like \"4MiB\" (units: {ACCEPTED_UNITS})"
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
        u64::try_from(v)
            .map(ByteSize)
            .map_err(|_| E::custom(SizeError::Negative { value: v }))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
        v.parse().map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ByteSizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        let cases = [
            ("4MiB", 4 << 20),
            ("64 KiB", 64 << 10),
            ("1GiB", 1 << 30),
            ("512B", 512),
            ("512", 512),
            ("2MB", 2_000_000),
            ("3kb", 3_000),
            (" 7 gib ", 7 << 30),
            ("0", 0),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<ByteSize>().unwrap(), ByteSize(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_values() {
        let e = "4 furlongs".parse::<ByteSize>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("4 furlongs") && msg.contains("MiB"), "{msg}");
        assert!(matches!(e, SizeError::UnknownUnit { .. }));
        assert!(matches!(
            "MiB".parse::<ByteSize>(),
            Err(SizeError::Syntax { .. })
        ));
        assert!(matches!(
            "1.5MiB".parse::<ByteSize>(),
            Err(SizeError::Syntax { .. })
        ));
        assert!(matches!(
            "99999999999TiB".parse::<ByteSize>(),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            "99999999999999999999999".parse::<ByteSize>(),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn displays_human_readable() {
        assert_eq!(ByteSize(4 << 20).to_string(), "4.0 MiB");
        assert_eq!(ByteSize(512).to_string(), "512 B");
        assert_eq!(ByteSize(1536).to_string(), "1.5 KiB");
        assert_eq!(ByteSize(1 << 30).to_string(), "1.0 GiB");
    }

    #[derive(Deserialize)]
    struct W {
        s: ByteSize,
    }

    #[test]
    fn deserializes_int_or_string() {
        let w: W = toml::from_str("s = 4096").unwrap();
        assert_eq!(w.s, ByteSize(4096));
        let w: W = toml::from_str("s = \"4MiB\"").unwrap();
        assert_eq!(w.s, ByteSize(4 << 20));
        let e = toml::from_str::<W>("s = -1").err().unwrap().to_string();
        assert!(e.contains("negative"), "{e}");
        let e = toml::from_str::<W>("s = \"4XB\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("accepted units"), "{e}");
    }
}
