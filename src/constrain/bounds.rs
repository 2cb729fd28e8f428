//! JSON that always ends (issue 39): bounds where a schema sets none.
//!
//! llguidance compiles a number to `[0-9]+` runs: an unbounded integral
//! part, and a fraction and exponent unbounded even when the schema gives
//! `minimum`/`maximum`. A model that likes digits (the random test model
//! always; a weakly quantized real one sometimes) then writes digits until
//! `max_tokens`: valid JSON so far, never finished. llama.cpp's schema
//! converter caps the integral part and the fraction at 16 digits; ds4 does
//! the same at the token level:
//!
//! - [`DigitRun`] follows the JSON text a constraint has accepted (inside or
//!   outside a string) and counts the digits of the current run outside
//!   strings: the integral part, the fraction and the exponent of a number
//!   are three runs. A token that would make a run longer than
//!   [`MAX_DIGIT_RUN`] (an exponent: [`MAX_EXPONENT_DIGITS`]) is dropped
//!   from the mask, **only when another token is allowed** (a schema whose numbers need more digits, `minimum: 1e20`,
//!   still gets them). The cap only ever removes tokens, so llguidance stays
//!   the judge of what is valid and of where EOS may come.
//! - String formats whose text repeats without end (fractional seconds of
//!   `date-time` and `time`, the parts of `email`, `hostname`, `duration`,
//!   `uri`) get a `maxLength` in the compiled copy of the schema where the
//!   schema has none ([`bound_formats`]); the client's schema is unchanged.

use serde_json::Value;

/// The longest run of digits outside strings while the number may end: 16,
/// as llama.cpp's `integral-part` and `decimal-part` (an f64 holds 15–17
/// significant digits).
pub const MAX_DIGIT_RUN: u32 = 16;

/// The most digits of an exponent: 2, so that every number the cap lets
/// end is a finite double (at most 10^16 · 10^99); a 3-digit exponent can
/// overflow to infinity, which strict parsers (serde_json) refuse.
pub const MAX_EXPONENT_DIGITS: u32 = 2;

/// `maxLength` given to a string `format` that has none: each the longest
/// text the format needs in practice (fractions of a second to 16 digits,
/// RFC 5321's 254-byte path, RFC 1035's 253-byte name).
pub const FORMAT_MAX_LENGTH: [(&str, u64); 6] = [
    // YYYY-MM-DDTHH:MM:SS . 16 digits +HH:MM
    ("date-time", 19 + 1 + 16 + 6),
    ("time", 8 + 1 + 16 + 6),
    ("duration", 64),
    ("email", 254),
    ("hostname", 253),
    ("uri", 2048),
];

/// Keywords whose values are data, not schemas: a `format` inside them is
/// a value to match as written.
const DATA_KEYWORDS: [&str; 4] = ["const", "enum", "default", "examples"];

/// Keywords whose values map names to schemas.
const NAMED_SCHEMAS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Adds `maxLength` to every subschema of `schema` with a string `format`
/// of [`FORMAT_MAX_LENGTH`] and no `maxLength` of its own.
pub fn bound_formats(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let bound = map
                .get("format")
                .and_then(Value::as_str)
                .and_then(|f| FORMAT_MAX_LENGTH.iter().find(|(name, _)| *name == f))
                .map(|&(_, n)| n);
            if let Some(n) = bound {
                map.entry("maxLength").or_insert(Value::from(n));
            }
            for (k, v) in map.iter_mut() {
                match (k.as_str(), v) {
                    (k, _) if DATA_KEYWORDS.contains(&k) => {}
                    // Maps from names to schemas: a property may be called
                    // `const` or `enum`.
                    (k, Value::Object(named)) if NAMED_SCHEMAS.contains(&k) => {
                        named.values_mut().for_each(bound_formats)
                    }
                    (_, v) => bound_formats(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bound_formats),
        _ => {}
    }
}

/// The leading ASCII digits of each token (0 for special tokens, whose
/// bytes start with toktrie's 0xFF marker), and the most any token has.
pub fn lead_digits(token: impl Fn(u32) -> Vec<u8>, n: usize) -> (Vec<u8>, u32) {
    let lead: Vec<u8> = (0..n as u32)
        .map(|t| {
            let d = token(t).iter().take_while(|b| b.is_ascii_digit()).count();
            d.min(u8::MAX as usize) as u8
        })
        .collect();
    let most = lead.iter().copied().max().unwrap_or(0) as u32;
    (lead, most)
}

/// Where the accepted JSON text stands: inside a string (after a
/// backslash), and how many digits the current run outside strings has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DigitRun {
    in_string: bool,
    escaped: bool,
    /// After `e`/`E` (and its sign) outside strings: the run is an exponent.
    exponent: bool,
    run: u32,
}

impl DigitRun {
    /// How many more digits the current run may take before the cap: the
    /// cap can only bite when a token has more leading digits than this.
    pub fn room(&self) -> u32 {
        let most = if self.exponent {
            MAX_EXPONENT_DIGITS
        } else {
            MAX_DIGIT_RUN
        };
        most.saturating_sub(self.run)
    }

    /// Whether a token that starts with `lead` digits would take the run
    /// past its bound ([`MAX_DIGIT_RUN`], [`MAX_EXPONENT_DIGITS`]).
    pub fn too_long(&self, lead: u8) -> bool {
        lead > 0 && !self.in_string && lead as u32 > self.room()
    }

    /// Follows the text of one accepted token.
    pub fn advance(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else if b.is_ascii_digit() {
                self.run += 1;
                continue;
            } else if b == b'"' {
                self.in_string = true;
            } else if matches!(b, b'e' | b'E') || (matches!(b, b'+' | b'-') && self.run == 0) {
                // `true` and `false` end in `e` too, but never meet a digit.
                self.exponent = matches!(b, b'e' | b'E') || self.exponent;
                self.run = 0;
                continue;
            }
            self.exponent = false;
            self.run = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn runs_count_digits_outside_strings_only() {
        let mut d = DigitRun::default();
        d.advance(br#"{"a1234":12"#);
        assert_eq!(d.room(), 14);
        d.advance(b"34.5");
        assert_eq!(d.room(), 15, "the fraction is a run of its own");
        d.advance(b"e-");
        assert_eq!(d.room(), 2, "an exponent has two digits");
        d.advance(b"1");
        assert!(d.too_long(2) && !d.too_long(1));
        d.advance(br#"2,"s":"\"99"#);
        assert_eq!(d.room(), 16, "inside a string, after an escaped quote");
        assert!(!d.too_long(3), "a digit in a string is never capped");
        d.advance(br#"9","n":-"#);
        d.advance(b"1234567890123456");
        assert_eq!(d.room(), 0);
        assert!(d.too_long(1) && !d.too_long(0));
        d.advance(b",true,");
        assert_eq!(d.room(), 16, "the e of true starts no exponent");
    }

    #[test]
    fn formats_get_a_max_length_where_they_have_none() {
        let mut s = json!({"type": "object", "properties": {
            "at": {"type": "string", "format": "date-time"},
            "mail": {"type": "string", "format": "email", "maxLength": 20},
            "day": {"type": "string", "format": "date"},
            "format": {"type": "string"},
            "c": {"const": {"format": "email"}},
            "const": {"type": "string", "format": "email"},
            "list": {"type": "array", "items": {"anyOf": [{"format": "time"}]}}}});
        bound_formats(&mut s);
        let p = &s["properties"];
        assert_eq!(p["at"]["maxLength"], 42);
        assert_eq!(p["mail"]["maxLength"], 20, "the schema's own bound stays");
        assert!(
            p["day"].get("maxLength").is_none(),
            "date is bounded already"
        );
        assert!(p["format"].get("maxLength").is_none());
        assert_eq!(
            p["c"]["const"],
            json!({"format": "email"}),
            "data untouched"
        );
        assert_eq!(p["const"]["maxLength"], 254, "a property named const");
        assert_eq!(p["list"]["items"]["anyOf"][0]["maxLength"], 31);
    }
}
