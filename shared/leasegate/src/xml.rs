//! A small XML reader for the two documents the Blob service answers with: a listing
//! (`EnumerationResults`) and an error (`<Error><Code>`). It builds a tree of elements with
//! their character data, refusing documents that are not well formed, and nothing more: no
//! namespaces, no DTD, attributes skipped.
//!
//! The documents: [List Blobs](https://learn.microsoft.com/rest/api/storageservices/list-blobs#response-body)
//! and [the error response](https://learn.microsoft.com/rest/api/storageservices/status-and-error-codes2).
//! Character references and the five predefined entities are decoded
//! ([XML 1.0 §4.1, §4.6](https://www.w3.org/TR/xml/#sec-references)); CDATA sections are text.

/// Elements nested deeper than this are refused (the service's documents have five levels).
const MAX_DEPTH: usize = 64;

/// One element: its name, its character data, its child elements.
#[derive(Debug, Default)]
pub(crate) struct Element {
    /// The name as written (with any prefix).
    pub name: String,
    /// The element's own character data, its pieces joined; `None` when it has none.
    pub text: Option<String>,
    /// The child elements, in order.
    pub children: Vec<Element>,
}

impl Element {
    /// The first child element named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The text of the first child element named `name`.
    pub fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).and_then(|c| c.text.as_deref())
    }

    /// This element and every element below it, depth first.
    pub fn find(&self, name: &str) -> Option<&Element> {
        if self.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(name))
    }
}

/// Parses a document into its root element; the error says what is wrong.
pub(crate) fn parse(text: &str) -> Result<Element, &'static str> {
    let mut r = Reader { s: text, i: 0 };
    // Open elements, the innermost last; the finished root ends up in `root`.
    let mut open: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        if r.rest().is_empty() {
            break;
        }
        if !r.rest().starts_with('<') {
            let end = r.rest().find('<').unwrap_or(r.rest().len());
            let raw = &r.rest()[..end];
            r.i += end;
            match open.last_mut() {
                Some(e) => push_text(e, &decode(raw)?),
                None if raw.trim_matches(is_space).is_empty() => {}
                None => return Err("text outside the root element"),
            }
        } else if r.eat("<?") {
            r.skip_past("?>")?;
        } else if r.eat("<!--") {
            r.skip_past("-->")?;
        } else if r.eat("<![CDATA[") {
            let end = find(r.rest(), "]]>").ok_or("unterminated CDATA")?;
            let raw = &r.rest()[..end];
            r.i += end + 3;
            push_text(
                open.last_mut().ok_or("CDATA outside the root element")?,
                raw,
            );
        } else if r.rest().starts_with("<!") {
            return Err("a DTD is not supported");
        } else if r.eat("</") {
            let name = r.name()?;
            r.skip_space();
            if !r.eat(">") {
                return Err("malformed end tag");
            }
            let element = open.pop().ok_or("end tag without a start tag")?;
            if element.name != name {
                return Err("end tag does not match its start tag");
            }
            close(element, &mut open, &mut root)?;
        } else {
            r.i += 1;
            let name = r.name()?.to_string();
            let empty = r.skip_attributes()?;
            let element = Element {
                name,
                ..Default::default()
            };
            if empty {
                close(element, &mut open, &mut root)?;
            } else if root.is_some() {
                return Err("more than one root element");
            } else if open.len() == MAX_DEPTH {
                return Err("elements nested too deep");
            } else {
                open.push(element);
            }
        }
    }
    if !open.is_empty() {
        return Err("an element is not closed");
    }
    root.ok_or("no root element")
}

/// A finished element goes to its parent, or becomes the root.
fn close(
    element: Element,
    open: &mut [Element],
    root: &mut Option<Element>,
) -> Result<(), &'static str> {
    match open.last_mut() {
        Some(parent) => parent.children.push(element),
        None if root.is_none() => *root = Some(element),
        None => return Err("more than one root element"),
    }
    Ok(())
}

fn push_text(element: &mut Element, text: &str) {
    element.text.get_or_insert_with(String::new).push_str(text);
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Decodes character and entity references.
fn decode(raw: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let end = rest[at..].find(';').ok_or("unterminated reference")? + at;
        let reference = &rest[at + 1..end];
        let c = match reference {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "apos" => '\'',
            "quot" => '"',
            _ => {
                let code = if let Some(hex) = reference.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = reference.strip_prefix('#') {
                    dec.parse().ok()
                } else {
                    return Err("unknown entity");
                };
                code.and_then(char::from_u32)
                    .filter(|c| *c != '\0')
                    .ok_or("invalid character reference")?
            }
        };
        out.push(c);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

struct Reader<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Reader<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    fn eat(&mut self, token: &str) -> bool {
        let found = self.rest().starts_with(token);
        if found {
            self.i += token.len();
        }
        found
    }

    fn skip_past(&mut self, token: &str) -> Result<(), &'static str> {
        let at = find(self.rest(), token).ok_or("unterminated markup")?;
        self.i += at + token.len();
        Ok(())
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.i += rest.len() - rest.trim_start_matches(is_space).len();
    }

    /// A name: up to whitespace, `/`, `>` or `=`; never empty.
    fn name(&mut self) -> Result<&'a str, &'static str> {
        let rest = self.rest();
        let end = rest
            .find(|c: char| is_space(c) || matches!(c, '/' | '>' | '=' | '<' | '"' | '\''))
            .unwrap_or(rest.len());
        if end == 0 {
            return Err("a name is missing");
        }
        self.i += end;
        Ok(&rest[..end])
    }

    /// Skips a start tag's attributes up to its end; `true` for an empty-element tag (`/>`).
    fn skip_attributes(&mut self) -> Result<bool, &'static str> {
        loop {
            self.skip_space();
            if self.eat("/>") {
                return Ok(true);
            }
            if self.eat(">") {
                return Ok(false);
            }
            self.name()?;
            self.skip_space();
            if !self.eat("=") {
                return Err("an attribute has no value");
            }
            self.skip_space();
            let quote = if self.eat("\"") {
                "\""
            } else if self.eat("'") {
                "'"
            } else {
                return Err("an attribute value is not quoted");
            };
            self.skip_past(quote)?;
        }
    }
}

/// Where `needle` starts in `hay`: a plain scan (the standard library's substring search is
/// 2 KB in a component, and these documents are small).
fn find(hay: &str, needle: &str) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.as_bytes()
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_text_and_references() {
        let doc = parse(
            "<?xml version=\"1.0\"?><!-- c --><a x=\"1>2\" y='z'>\
             <b>one &amp; two &#x41;&#66;</b><c/><b><![CDATA[<raw>]]></b> </a>",
        )
        .unwrap();
        assert_eq!(doc.name, "a");
        assert_eq!(doc.children.len(), 3);
        assert_eq!(doc.child_text("b"), Some("one & two AB"));
        assert_eq!(doc.child("c").unwrap().text, None);
        assert_eq!(doc.children[2].text.as_deref(), Some("<raw>"));
        assert_eq!(doc.find("c").unwrap().name, "c");
    }

    #[test]
    fn malformed_documents_are_refused() {
        for bad in [
            "",
            "<html>",
            "<a></b>",
            "<a/><b/>",
            "text",
            "<a>&nope;</a>",
            "<a>&#0;</a>",
            "<a x=1/>",
            "<a><!-- </a>",
            "</a>",
            "<!DOCTYPE a><a/>",
            "<a>&amp</a>",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let deep = "<a>".repeat(MAX_DEPTH + 1) + &"</a>".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).is_err());
    }
}
