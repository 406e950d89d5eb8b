//! The shape every body must have before serde sees it (SPEC 3.1, 3.2): one
//! map and nothing after it, string keys at every depth, no key twice in a
//! map, a string `type`, no `bin` or `ext` anywhere, and a bounded depth.
//! serde alone would take `{type: 0}` as the first variant and bin for str.

/// Deeper nesting than any message has; bounds the walk's work and memory.
pub const MAX_DEPTH: usize = 16;

/// Checks `body`; the error says what is wrong, for people.
pub fn check(body: &[u8]) -> Result<(), String> {
    let mut reader = Reader { body, at: 0 };
    let Item::Map(fields) = reader.item()? else {
        return Err("the body is not a map".into());
    };
    let mut walk = Walk {
        reader,
        open: Vec::new(),
    };
    walk.map(fields, 1, true)?;
    while let Some(frame) = walk.open.pop() {
        walk.resume(frame)?;
    }
    if walk.reader.at != body.len() {
        return Err(format!(
            "{} bytes follow the body's map",
            body.len() - walk.reader.at
        ));
    }
    Ok(())
}

/// One MessagePack value's head: containers carry their element counts.
enum Item<'a> {
    Scalar,
    Str(&'a [u8]),
    Array(usize),
    Map(usize),
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.body.len());
        let end = end.ok_or("the body ends inside a value")?;
        let bytes = &self.body[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn length(&mut self, width: usize) -> Result<usize, String> {
        let bytes = self.take(width)?;
        Ok(bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b)))
    }

    fn item(&mut self) -> Result<Item<'a>, String> {
        let marker = self.take(1)?[0];
        let item = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Item::Scalar,
            0x80..=0x8f => Item::Map(usize::from(marker & 0x0f)),
            0x90..=0x9f => Item::Array(usize::from(marker & 0x0f)),
            0xa0..=0xbf => {
                let n = usize::from(marker & 0x1f);
                Item::Str(self.take(n)?)
            }
            0xca => self.take(4).map(|_| Item::Scalar)?,
            0xcb => self.take(8).map(|_| Item::Scalar)?,
            0xcc | 0xd0 => self.take(1).map(|_| Item::Scalar)?,
            0xcd | 0xd1 => self.take(2).map(|_| Item::Scalar)?,
            0xce | 0xd2 => self.take(4).map(|_| Item::Scalar)?,
            0xcf | 0xd3 => self.take(8).map(|_| Item::Scalar)?,
            0xd9..=0xdb => {
                let n = self.length(1 << (marker - 0xd9))?;
                Item::Str(self.take(n)?)
            }
            0xdc | 0xdd => Item::Array(self.length(2 << (marker - 0xdc))?),
            0xde | 0xdf => Item::Map(self.length(2 << (marker - 0xde))?),
            0xc4..=0xc6 => return Err("bin is not used in bodies; strings are str".into()),
            0xc7..=0xc9 | 0xd4..=0xd8 => return Err("ext types are not used in bodies".into()),
            0xc1 => return Err("0xc1 is not a MessagePack value".into()),
        };
        Ok(item)
    }
}

/// A container left to finish after a nested one: an array's remaining
/// elements, or a map's remaining fields and the keys it has seen.
enum Frame<'a> {
    Array {
        left: usize,
        depth: usize,
    },
    Map {
        left: usize,
        depth: usize,
        keys: Vec<&'a [u8]>,
        top: bool,
    },
}

struct Walk<'a> {
    reader: Reader<'a>,
    open: Vec<Frame<'a>>,
}

impl<'a> Walk<'a> {
    fn resume(&mut self, frame: Frame<'a>) -> Result<(), String> {
        match frame {
            Frame::Array { left, depth } => self.array(left, depth),
            Frame::Map {
                left,
                depth,
                keys,
                top,
            } => self.fields(left, depth, keys, top),
        }
    }

    fn map(&mut self, fields: usize, depth: usize, top: bool) -> Result<(), String> {
        self.fields(fields, depth, Vec::new(), top)
    }

    fn fields(
        &mut self,
        mut left: usize,
        depth: usize,
        mut keys: Vec<&'a [u8]>,
        top: bool,
    ) -> Result<(), String> {
        while left > 0 {
            left -= 1;
            let Item::Str(key) = self.reader.item()? else {
                return Err("a map key is not a string".into());
            };
            if std::str::from_utf8(key).is_err() {
                return Err("a map key is not UTF-8".into());
            }
            if keys.contains(&key) {
                return Err(format!(
                    "the key {:?} appears twice in a map",
                    String::from_utf8_lossy(key)
                ));
            }
            keys.push(key);
            let value = self.reader.item()?;
            if top && key == b"type" && !matches!(value, Item::Str(_)) {
                return Err("`type` is not a string".into());
            }
            if self.nested(value, depth, || Frame::Map {
                left,
                depth,
                keys: std::mem::take(&mut keys),
                top,
            })? {
                return Ok(());
            }
        }
        Ok(())
    }

    fn array(&mut self, mut left: usize, depth: usize) -> Result<(), String> {
        while left > 0 {
            left -= 1;
            let value = self.reader.item()?;
            if self.nested(value, depth, || Frame::Array { left, depth })? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Enters a container value: the rest of the current one is set aside
    /// (returns true), so nesting costs heap, not stack.
    fn nested(
        &mut self,
        value: Item<'a>,
        depth: usize,
        rest: impl FnOnce() -> Frame<'a>,
    ) -> Result<bool, String> {
        let (inner, is_map) = match value {
            Item::Array(n) => (n, false),
            Item::Map(n) => (n, true),
            Item::Scalar | Item::Str(_) => return Ok(false),
        };
        if depth >= MAX_DEPTH {
            return Err(format!("values nest deeper than {MAX_DEPTH} levels"));
        }
        self.open.push(rest());
        let inner_frame = if is_map {
            Frame::Map {
                left: inner,
                depth: depth + 1,
                keys: Vec::new(),
                top: false,
            }
        } else {
            Frame::Array {
                left: inner,
                depth: depth + 1,
            }
        };
        self.open.push(inner_frame);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: &impl serde::Serialize) -> Vec<u8> {
        rmp_serde::to_vec_named(value).expect("encode")
    }

    #[test]
    fn well_formed_bodies_pass() {
        let hello = crate::Envelope::event(crate::ClientMessage::Hello {
            version: 1,
            client: "t".into(),
            pid: 2,
            takes_locks: false,
        });
        assert_eq!(check(&body(&hello)), Ok(()));
        let reattach = crate::Envelope::request(
            4,
            crate::ClientMessage::Reattach {
                leases: vec![crate::Lease {
                    slot: None,
                    key: "k".into(),
                    lease_id: "l".into(),
                    token: 3,
                }],
                on_lost: crate::OnLost::Term,
            },
        );
        assert_eq!(check(&body(&reattach)), Ok(()));
    }

    #[test]
    fn a_type_that_is_not_a_string_is_refused() {
        // {"type": 0}, and {"x": [], "type": 1}: after a nested value too
        let first = [0x81, 0xa4, b't', b'y', b'p', b'e', 0x00];
        let later = [0x82, 0xa1, b'x', 0x90, 0xa4, b't', b'y', b'p', b'e', 0x01];
        for bytes in [&first[..], &later[..]] {
            assert!(check(bytes).expect_err("type 0").contains("`type`"));
        }
    }

    #[test]
    fn bin_ext_trailing_bytes_and_odd_keys_are_refused() {
        let cases: &[(&[u8], &str)] = &[
            // {"type": bin "ping"}
            (
                &[
                    0x81, 0xa4, b't', b'y', b'p', b'e', 0xc4, 4, b'p', b'i', b'n', b'g',
                ],
                "bin",
            ),
            // {"type": "ping", "x": fixext1}
            (
                &[
                    0x82, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'p', b'i', b'n', b'g', 0xa1, b'x',
                    0xd4, 0, 0,
                ],
                "ext",
            ),
            // {"type": "ping"} then one more byte
            (
                &[
                    0x81, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'p', b'i', b'n', b'g', 0xc0,
                ],
                "follow",
            ),
            // {1: "ping"}
            (
                &[0x81, 0x01, 0xa4, b'p', b'i', b'n', b'g'],
                "key is not a string",
            ),
            // {"type": "ping", "type": "ping"}
            (
                &[
                    0x82, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'p', b'i', b'n', b'g', 0xa4, b't',
                    b'y', b'p', b'e', 0xa4, b'p', b'i', b'n', b'g',
                ],
                "twice",
            ),
            // an array, not a map
            (&[0x91, 0x01], "not a map"),
            // a map of 2 fields with 1 present
            (
                &[
                    0x82, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'p', b'i', b'n', b'g',
                ],
                "ends inside",
            ),
        ];
        for (bytes, why) in cases {
            let err = check(bytes).expect_err(why);
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn nesting_is_bounded_without_recursion() {
        // {"type": "ping", "x": [[[[…]]]]} far deeper than MAX_DEPTH
        let mut bytes = vec![
            0x82, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'p', b'i', b'n', b'g', 0xa1, b'x',
        ];
        bytes.extend(std::iter::repeat_n(0x91, 100_000));
        bytes.push(0xc0);
        assert!(check(&bytes).expect_err("too deep").contains("deeper"));
        let mut shallow = bytes[..13].to_vec();
        shallow.extend([0x92, 0x91, 0x80, 0x81, 0xa1, b'y', 0x91, 0x01]);
        assert_eq!(check(&shallow), Ok(()));
    }
}
