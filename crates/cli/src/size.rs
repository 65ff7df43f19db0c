//! Byte sizes on the command line: `4096`, `64K`, `1M`, `4G`, `1T` (powers of
//! 1024; `KiB`, `MB` and lower case are read the same way).

/// A size that must fit this machine's address space (a buffer's, a cache's).
pub fn parse_usize(text: &str) -> Result<usize, String> {
    usize::try_from(parse(text)?).map_err(|_| format!("'{text}' is too large for this machine"))
}

pub fn parse(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size: use a number with an optional K, M, G or T suffix"))?;
    let shift = match suffix
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("'{text}' has an unknown suffix: use K, M, G or T")),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn sizes() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("64K"), Ok(65536));
        assert_eq!(parse("1MiB"), Ok(1 << 20));
        assert_eq!(parse("4g"), Ok(4 << 30));
        assert!(parse("12Q").is_err());
        assert!(parse("").is_err());
        assert!(parse("99999999999T").is_err());
    }
}
