//! Kubernetes resource quantities (`500m`, `1`, `0.5`, `512Mi`, `1G`, `1e3`) parsed exactly into
//! the units AWARE works in: CPU millicores and memory bytes.
//!
//! A quantity is `<number><suffix>`: the number is unsigned decimal (`1`, `0.5`, `.5`); the
//! suffix is a binary SI one (`Ki Mi Gi Ti Pi Ei`), a decimal SI one (`n u m "" k M G T P E`) or a
//! decimal exponent (`e3`, `E-2`). As Kubernetes does (`MilliValue`, `Value`), a fraction of the
//! target unit rounds up.

use thiserror::Error;

/// Why a string is not a usable quantity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    #[error(
        "`{0}` is not a Kubernetes quantity (expected e.g. `500m`, `1`, `0.5`, `512Mi`, `1G`)"
    )]
    Syntax(String),
    #[error("`{0}` is negative")]
    Negative(String),
    #[error("`{0}` is too large")]
    Overflow(String),
}

/// `mantissa × 10^exp10 × 2^exp2`, exactly as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parsed {
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

fn parse(s: &str) -> Result<Parsed, QuantityError> {
    let syntax = || QuantityError::Syntax(s.to_string());
    let t = s.trim();
    if t != s || t.is_empty() {
        return Err(syntax());
    }
    let body = if let Some(rest) = t.strip_prefix('-') {
        if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return Err(QuantityError::Negative(s.to_string()));
        }
        return Err(syntax());
    } else {
        t.strip_prefix('+').unwrap_or(t)
    };
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(syntax());
    }
    let mut mantissa: u128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        let d = u128::from(c.to_digit(10).ok_or_else(syntax)?);
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(d))
            .ok_or_else(|| QuantityError::Overflow(s.to_string()))?;
    }
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| syntax())?;
    let (exp10, exp2) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => {
            let exp = other
                .strip_prefix(['e', 'E'])
                .filter(|e| {
                    let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
                })
                .ok_or_else(syntax)?;
            let exp: i32 = exp
                .parse()
                .map_err(|_| QuantityError::Overflow(s.to_string()))?;
            (exp, 0)
        }
    };
    Ok(Parsed {
        mantissa,
        exp10: exp10
            .checked_sub(frac_len)
            .ok_or_else(|| QuantityError::Overflow(s.to_string()))?,
        exp2,
    })
}

/// The quantity `s` in units of `10^unit_exp10`, rounded up.
fn in_units(s: &str, unit_exp10: i32) -> Result<u128, QuantityError> {
    let overflow = || QuantityError::Overflow(s.to_string());
    let p = parse(s)?;
    if p.mantissa == 0 {
        return Ok(0);
    }
    let scaled = p
        .mantissa
        .checked_mul(1u128.checked_shl(p.exp2).ok_or_else(overflow)?)
        .ok_or_else(overflow)?;
    let exp = p.exp10.checked_sub(unit_exp10).ok_or_else(overflow)?;
    if exp >= 0 {
        let factor = 10u128
            .checked_pow(u32::try_from(exp).map_err(|_| overflow())?)
            .ok_or_else(overflow)?;
        scaled.checked_mul(factor).ok_or_else(overflow)
    } else {
        // A divisor beyond u128 means the value is a tiny positive fraction: one unit.
        match 10u128.checked_pow(exp.unsigned_abs()) {
            Some(div) => Ok(scaled.div_ceil(div)),
            None => Ok(1),
        }
    }
}

/// CPU quantity in millicores (`500m` → 500, `1` → 1000, `0.5` → 500), rounded up.
pub fn parse_cpu_millicores(s: &str) -> Result<u32, QuantityError> {
    u32::try_from(in_units(s, -3)?).map_err(|_| QuantityError::Overflow(s.to_string()))
}

/// Memory quantity in bytes (`512Mi`, `1Gi`, `536870912`, `1G`), rounded up.
pub fn parse_memory_bytes(s: &str) -> Result<u64, QuantityError> {
    u64::try_from(in_units(s, 0)?).map_err(|_| QuantityError::Overflow(s.to_string()))
}

/// Canonical CPU quantity: whole cores as `2`, otherwise millicores as `500m`.
pub fn format_cpu(millicores: u32) -> String {
    if millicores.is_multiple_of(1000) {
        (millicores / 1000).to_string()
    } else {
        format!("{millicores}m")
    }
}

/// Canonical memory quantity: the largest binary suffix that divides exactly (`512Mi`, `1Gi`),
/// otherwise plain bytes.
pub fn format_memory(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes == 0 {
        return "0".to_string();
    }
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1024 * 1024;

    #[test]
    fn cpu_quantities() {
        for (q, m) in [
            ("500m", 500),
            ("1", 1000),
            ("0.5", 500),
            (".25", 250),
            ("1.5", 1500),
            ("2", 2000),
            ("100m", 100),
            ("1500000u", 1500),
            ("5e-1", 500),
            ("2E0", 2000),
            ("+1", 1000),
            ("0", 0),
            // rounds up like Kubernetes' MilliValue
            ("0.0001", 1),
            ("1n", 1),
            ("1500001u", 1501),
        ] {
            assert_eq!(parse_cpu_millicores(q), Ok(m), "{q}");
        }
    }

    #[test]
    fn memory_quantities() {
        for (q, b) in [
            ("512Mi", 512 * MI),
            ("1Gi", 1024 * MI),
            ("536870912", 536_870_912),
            ("1G", 1_000_000_000),
            ("1.5Gi", 1536 * MI),
            ("128k", 128_000),
            ("64Ki", 65_536),
            ("1e9", 1_000_000_000),
            ("0.5Ki", 512),
            ("1m", 1),
        ] {
            assert_eq!(parse_memory_bytes(q), Ok(b), "{q}");
        }
    }

    #[test]
    fn bad_quantities_are_typed_errors() {
        for q in [
            "", " 1", "1 ", "abc", "1.2.3", "1Mb", "1gi", "Mi", ".", "1e", "1e+", "1x", "0x10",
            "1e3m",
        ] {
            assert!(
                matches!(parse_memory_bytes(q), Err(QuantityError::Syntax(_))),
                "{q:?} -> {:?}",
                parse_memory_bytes(q)
            );
        }
        assert_eq!(
            parse_cpu_millicores("-1"),
            Err(QuantityError::Negative("-1".into()))
        );
        assert!(matches!(
            parse_cpu_millicores("5000000"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            parse_memory_bytes("100Ei"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            parse_memory_bytes("1e999"),
            Err(QuantityError::Overflow(_))
        ));
        let msg = parse_cpu_millicores("one").unwrap_err().to_string();
        assert!(msg.contains("`one`") && msg.contains("500m"), "{msg}");
    }

    #[test]
    fn format_round_trips() {
        for m in [1, 128, 500, 1000, 1500, 2048, 4000] {
            assert_eq!(parse_cpu_millicores(&format_cpu(m)), Ok(m));
        }
        assert_eq!(format_cpu(500), "500m");
        assert_eq!(format_cpu(2000), "2");
        for b in [1, 1000, 1024, 256 * MI, 3072 * MI, 1_000_000_000] {
            assert_eq!(parse_memory_bytes(&format_memory(b)), Ok(b));
        }
        assert_eq!(format_memory(512 * MI), "512Mi");
        assert_eq!(format_memory(3072 * MI), "3Gi");
        assert_eq!(format_memory(1000), "1000");
    }
}
