//! Ranges as text: parsed and written by hand for the forms ranges are written in, since
//! ipnet's backtracking parser and `core::fmt` are several times slower in wasm and every node
//! update reads or writes its ranges. Anything else is parsed by ipnet; what is written is
//! exactly what `Display` writes (both checked on generated text in the tests).

use alloc::string::String;
use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Parses a range; host bits are cleared, as Kubernetes' `net.ParseCIDR` does.
pub fn parse_cidr(text: &str) -> Result<IpNet, ParseError> {
    if text.is_empty() {
        return Err(ParseError::Empty);
    }
    match parse_plain(text.as_bytes()) {
        Some(range) => Ok(range),
        None => text
            .parse::<IpNet>()
            .map(|range| range.trunc())
            .map_err(|_| ParseError::Malformed),
    }
}

/// Why a range did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The empty string.
    Empty,
    /// Not `address/prefix`.
    Malformed,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Empty => "empty, expected address/prefix",
            Self::Malformed => "not a cidr (expected address/prefix, e.g. 10.0.0.0/24)",
        })
    }
}

/// `a.b.c.d/p`, or IPv6 hex groups with at most one `::` (no embedded IPv4) and `/p`, in one
/// pass, host bits cleared; `None` for anything else. Where it answers, it answers as ipnet
/// does, leading zeros included: octets of 1 to 3 digits, groups of 1 to 4, prefixes of 1 to
/// 2 (IPv4) or 3 (IPv6) digits, and `::` standing for zero or more groups.
fn parse_plain(text: &[u8]) -> Option<IpNet> {
    parse_ipv4(text).or_else(|| parse_ipv6(text))
}

fn parse_ipv4(text: &[u8]) -> Option<IpNet> {
    let mut octets = [0u8; 4];
    let mut at = 0;
    for (i, octet) in octets.iter_mut().enumerate() {
        let (value, end) = decimal(text, at, 3)?;
        *octet = u8::try_from(value).ok()?;
        let separator = if i == 3 { b'/' } else { b'.' };
        if text.get(end) != Some(&separator) {
            return None;
        }
        at = end + 1;
    }
    let prefix = prefix(text, at, 2, 32)?;
    let range = Ipv4Net::new(Ipv4Addr::from(octets), prefix).ok()?;
    Some(IpNet::V4(range.trunc()))
}

fn parse_ipv6(text: &[u8]) -> Option<IpNet> {
    let mut groups = [0u16; 8];
    let mut count = 0;
    // Where `::` stands: the number of groups before it.
    let mut gap = None;
    let mut at = 0;
    if text.starts_with(b"::") {
        gap = Some(0);
        at = 2;
    }
    loop {
        if gap == Some(count) && text.get(at) == Some(&b'/') {
            break;
        }
        let (group, end) = hex(text, at)?;
        *groups.get_mut(count)? = group;
        count += 1;
        at = end;
        match (text.get(at), text.get(at + 1)) {
            (Some(b'/'), _) => break,
            (Some(b':'), Some(b':')) if gap.is_none() => {
                gap = Some(count);
                at += 2;
            }
            (Some(b':'), Some(b':')) => return None,
            (Some(b':'), _) => at += 1,
            _ => return None,
        }
    }
    match gap {
        None if count == 8 => {}
        Some(head) if head < 8 => {
            let tail = count - head;
            groups.copy_within(head..count, 8 - tail);
            groups[head..8 - tail].fill(0);
        }
        _ => return None,
    }
    let prefix = prefix(text, at + 1, 3, 128)?;
    // Host bits cleared group by group (no 128-bit shifts, which wasm has no instruction for).
    for (i, group) in groups.iter_mut().enumerate() {
        let kept = u32::from(prefix).saturating_sub(16 * i as u32).min(16);
        *group &= !(u16::MAX.checked_shr(kept).unwrap_or(0));
    }
    let range = Ipv6Net::new(Ipv6Addr::from(groups), prefix).ok()?;
    Some(IpNet::V6(range))
}

/// The prefix length: the decimal number that ends the text, of 1 to `max_digits` digits, at
/// most `max`.
fn prefix(text: &[u8], at: usize, max_digits: usize, max: u32) -> Option<u8> {
    let (value, end) = decimal(text, at, max_digits)?;
    if end != text.len() || value > max {
        return None;
    }
    u8::try_from(value).ok()
}

/// The decimal number of 1 to `max_digits` digits at `at`, and where it ends.
fn decimal(text: &[u8], at: usize, max_digits: usize) -> Option<(u32, usize)> {
    let mut value = 0u32;
    let mut end = at;
    while let Some(&b) = text.get(end) {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        value = value * 10 + u32::from(digit);
        end += 1;
        if end - at > max_digits {
            return None;
        }
    }
    (end > at).then_some((value, end))
}

/// The group of 1 to 4 hex digits (either case) at `at`, and where it ends.
fn hex(text: &[u8], at: usize) -> Option<(u16, usize)> {
    let mut value = 0u32;
    let mut end = at;
    while let Some(&b) = text.get(end) {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => break,
        };
        value = value << 4 | u32::from(digit);
        end += 1;
        if end - at > 4 {
            return None;
        }
    }
    (end > at).then_some((value as u16, end))
}

/// `range` as text, as its `Display` writes it, written directly: `core::fmt` is several times
/// slower in wasm, and every allocation writes its ranges twice.
pub fn cidr_string(range: IpNet) -> String {
    let mut text = String::with_capacity(48);
    match range {
        IpNet::V4(net) => push_ipv4(&mut text, net.addr().octets()),
        IpNet::V6(net) => push_ipv6(&mut text, net.addr()),
    }
    text.push('/');
    push_decimal(&mut text, range.prefix_len());
    text
}

fn push_ipv4(text: &mut String, octets: [u8; 4]) {
    for (i, octet) in octets.into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        push_decimal(text, octet);
    }
}

/// RFC 5952 text, as `Ipv6Addr`'s `Display`: lower-case hex groups without leading zeros, the
/// longest run of two or more zero groups (the first on a tie) as `::`, and IPv4-mapped
/// addresses as `::ffff:a.b.c.d`.
fn push_ipv6(text: &mut String, addr: Ipv6Addr) {
    if let Some(v4) = addr.to_ipv4_mapped() {
        text.push_str("::ffff:");
        push_ipv4(text, v4.octets());
        return;
    }
    let groups = addr.segments();
    let (mut zeros_at, mut zeros_len) = (0, 0);
    let mut i = 0;
    while i < groups.len() {
        let run = groups[i..].iter().take_while(|&&g| g == 0).count();
        if run > zeros_len {
            (zeros_at, zeros_len) = (i, run);
        }
        i += run.max(1);
    }
    let push_groups = |text: &mut String, groups: &[u16]| {
        for (i, &group) in groups.iter().enumerate() {
            if i > 0 {
                text.push(':');
            }
            push_hex(text, group);
        }
    };
    if zeros_len > 1 {
        push_groups(text, &groups[..zeros_at]);
        text.push_str("::");
        push_groups(text, &groups[zeros_at + zeros_len..]);
    } else {
        push_groups(text, &groups);
    }
}

fn push_hex(text: &mut String, group: u16) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut started = false;
    for shift in [12, 8, 4, 0] {
        let digit = usize::from((group >> shift) & 0xf);
        if digit != 0 || started || shift == 0 {
            text.push(char::from(DIGITS[digit]));
            started = true;
        }
    }
}

fn push_decimal(text: &mut String, value: u8) {
    if value >= 100 {
        text.push(char::from(b'0' + value / 100));
    }
    if value >= 10 {
        text.push(char::from(b'0' + value / 10 % 10));
    }
    text.push(char::from(b'0' + value % 10));
}

#[cfg(test)]
mod tests {
    use alloc::string::ToString;
    use alloc::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn plain_forms_parse_by_hand_as_ipnet_parses_them() {
        for text in [
            "10.0.0.0/8",
            "0.0.0.0/0",
            "255.255.255.255/32",
            "010.001.0.00/08",
            "fd00::/64",
            "FD00:0:0:9::/64",
            "::/0",
            "::1/128",
            "1::/16",
            "1:2:3:4:5:6:7:8/128",
            "1:2:3:4:5:6:7::/112",
            "::2:3:4:5:6:7:8/128",
            "0001:02:3::0/064",
        ] {
            assert_eq!(
                parse_plain(text.as_bytes()),
                Some(net(text).trunc()),
                "{text}"
            );
        }
    }

    #[test]
    fn other_forms_are_left_to_ipnet() {
        for text in ["::ffff:10.1.2.3/128", "::10.1.2.3/96", "1:2::3.4.5.6/128"] {
            assert_eq!(parse_plain(text.as_bytes()), None, "{text}");
            assert_eq!(parse_cidr(text), Ok(net(text).trunc()), "{text}");
        }
    }

    #[test]
    fn malformed_ranges_are_refused() {
        assert_eq!(parse_cidr(""), Err(ParseError::Empty));
        for text in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/032",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "256.0.0.0/8",
            "1000.0.0.0/8",
            "10.0.0.0/+8",
            "10.0.0.0/8/8",
            " 10.0.0.0/8",
            "fd00::/129",
            "fd00::/0128",
            "fd00:::/64",
            "fd00::1::/64",
            ":1::/64",
            "1::2:/64",
            "1:2:3:4:5:6:7:8::/64",
            "1:2:3:4:5:6:7:8:9/64",
            "1:2:3:4:5:6:7/64",
            "12345::/64",
            "g::/64",
            "fd00::/6４",
            "10.0.0.0/99999999999999999999",
            "99999999999999999999.0.0.0/8",
            "fd00::/99999999999999999999",
            "fffffffffffffffffffff::/64",
        ] {
            assert_eq!(parse_cidr(text), Err(ParseError::Malformed), "{text}");
        }
    }

    #[test]
    fn host_bits_are_cleared() {
        assert_eq!(parse_cidr("10.1.2.3/8"), Ok(net("10.0.0.0/8")));
        assert_eq!(parse_cidr("fd00::1/64"), Ok(net("fd00::/64")));
    }

    /// Text made of the characters ranges are written with, often close to a range.
    fn range_like() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[0-9]{1,4}",
            "[0-9a-fA-F]{1,5}",
            Just(".".to_string()),
            Just(":".to_string()),
            Just("::".to_string()),
            Just("/".to_string()),
        ];
        prop::collection::vec(piece, 1..20).prop_map(|pieces| pieces.concat())
    }

    /// A range as written, or with leading zeros, with one character replaced, inserted or
    /// removed: text on both sides of what parses.
    fn near_range() -> impl Strategy<Value = String> {
        let range = prop_oneof![
            (any::<u32>(), 0u8..=40).prop_map(|(a, p)| alloc::format!("{}/{p}", Ipv4Addr::from(a))),
            (
                prop::array::uniform8(prop_oneof![Just(0u16), any::<u16>()]),
                0u8..=140
            )
                .prop_map(|(g, p)| alloc::format!("{}/{p}", Ipv6Addr::from(g))),
            (any::<[u8; 4]>(), 0u8..=40).prop_map(|(o, p)| alloc::format!(
                "{:03}.{:03}.{}.{:02}/{p:02}",
                o[0],
                o[1],
                o[2],
                o[3]
            )),
        ];
        let edit = (
            any::<prop::sample::Index>(),
            0..3u8,
            prop::sample::select(&b"0179afF.:/"[..]),
        );
        (range, edit).prop_map(|(text, (at, how, c))| {
            let mut bytes = text.into_bytes();
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = c,
                1 => bytes.insert(i, c),
                _ => {
                    bytes.remove(i);
                }
            }
            String::from_utf8(bytes).unwrap()
        })
    }

    proptest! {
        #[test]
        fn by_hand_agrees_with_ipnet_wherever_it_answers(
            text in prop_oneof![range_like(), near_range()]
        ) {
            if let Some(range) = parse_plain(text.as_bytes()) {
                prop_assert_eq!(text.parse::<IpNet>().map(|r| r.trunc()), Ok(range), "{}", text);
            }
        }

        #[test]
        fn every_ipv4_range_written_parses_by_hand(addr: u32, prefix in 0u8..=32) {
            let range = IpNet::V4(Ipv4Net::new(Ipv4Addr::from(addr), prefix).unwrap());
            prop_assert_eq!(parse_plain(cidr_string(range).as_bytes()), Some(range.trunc()));
        }

        #[test]
        fn every_ipv6_range_written_without_ipv4_parses_by_hand(
            groups in prop::array::uniform8(prop_oneof![Just(0u16), any::<u16>()]),
            prefix in 0u8..=128,
        ) {
            let range = IpNet::V6(Ipv6Net::new(Ipv6Addr::from(groups), prefix).unwrap());
            let text = cidr_string(range);
            let expected = (!text.contains('.')).then_some(range.trunc());
            prop_assert_eq!(parse_plain(text.as_bytes()), expected, "{}", text);
        }

        #[test]
        fn every_ipv6_range_parses_by_hand_in_full_form(groups: [u16; 8], prefix in 0u8..=128) {
            let range = IpNet::V6(Ipv6Net::new(Ipv6Addr::from(groups), prefix).unwrap());
            let full: Vec<String> = groups.iter().map(|g| alloc::format!("{g:x}")).collect();
            let text = alloc::format!("{}/{prefix}", full.join(":"));
            prop_assert_eq!(parse_plain(text.as_bytes()), Some(range.trunc()));
        }
    }

    #[test]
    fn cidr_strings_are_what_display_writes() {
        for text in [
            "0.0.0.0/0",
            "10.0.0.0/8",
            "10.9.99.100/30",
            "255.255.255.255/32",
            "192.168.10.0/24",
            "fd00::/64",
            "::/0",
            "::1/128",
            "::ffff:10.1.2.3/128",
            "::10.1.2.3/128",
            "1:0:0:1::/64",
            "1::1:0:0:1/128",
            "fd00:0:0:1::/64",
            "fe80::1:2:3:4/128",
            "1:2:3:4:5:6:7:8/128",
        ] {
            let range = net(text);
            assert_eq!(cidr_string(range), range.to_string(), "{text}");
        }
    }

    proptest! {
        #[test]
        fn every_ipv4_cidr_string_is_what_display_writes(addr: u32, prefix in 0u8..=32) {
            let range = IpNet::V4(Ipv4Net::new(Ipv4Addr::from(addr), prefix).unwrap());
            prop_assert_eq!(cidr_string(range), range.to_string());
        }

        #[test]
        fn every_ipv6_cidr_string_is_what_display_writes(
            // Zero groups are common (runs to compress, ties, IPv4-mapped and -compatible forms).
            groups in prop::array::uniform8(prop_oneof![
                Just(0u16),
                Just(0xffffu16),
                any::<u16>(),
            ]),
            prefix in 0u8..=128,
        ) {
            let addr = Ipv6Addr::from(groups);
            let range = IpNet::V6(Ipv6Net::new(addr, prefix).unwrap());
            prop_assert_eq!(cidr_string(range), range.to_string());
        }
    }
}
