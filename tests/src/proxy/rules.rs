//! The faults set by rule (newest first, each with its passes and uses) and drawn at random.

use super::Fault;

/// The faults set by rule, newest first.
pub(super) type Rules = Vec<Rule>;

/// A fault set by rule.
pub(super) struct Rule {
    /// The part of `METHOD target` it matches (`None`: every request).
    pub(super) part: Option<String>,
    pub(super) fault: Fault,
    /// Matching requests it lets pass before it applies.
    pub(super) skip: usize,
    /// How many more matching requests it applies to (`None`: all); then it is gone.
    pub(super) times: Option<usize>,
}

/// The fault the newest rule matching `line` applies to it, counting the rule's passes and uses.
/// A rule that lets this request pass (its `skip`) still stands in front of the older ones: the
/// request gets no fault.
pub(super) fn ruled_fault(rules: &mut Rules, line: &str) -> Option<Fault> {
    let k = rules
        .iter()
        .position(|r| r.part.as_ref().is_none_or(|p| line.contains(p.as_str())))?;
    let rule = &mut rules[k];
    if rule.skip > 0 {
        rule.skip -= 1;
        return None;
    }
    let fault = rule.fault.clone();
    if let Some(left) = rule.times.as_mut() {
        *left -= 1;
        if *left == 0 {
            rules.remove(k);
        }
    }
    Some(fault)
}

/// The fault of `chances` whose share of [0, 1) holds `u` (the first takes `[0, p1)`, the next
/// `[p1, p1 + p2)`, ...), or none past them.
pub(super) fn draw(chances: &[(Fault, f64)], u: f64) -> Option<Fault> {
    let mut upto = 0.0;
    for (fault, p) in chances {
        upto += p;
        if u < upto {
            return Some(fault.clone());
        }
    }
    None
}
