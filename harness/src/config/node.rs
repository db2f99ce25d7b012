//! A place inside a config: the value there and the path that reached it, so that every edit is
//! checked against the config's real shape and every failure names the file and the path.

use anyhow::{anyhow, Result};
use serde_json::Value;

use super::path::{self, KeyPath};

/// A subtree of a config, borrowed for editing. The typed views (listener, cluster, ...) are
/// `Node`s with named edits; `get`/`set`/`insert`/`remove` reach anything else.
pub struct Node<'a> {
    value: &'a mut Value,
    origin: &'a str,
    at: KeyPath,
}

impl<'a> Node<'a> {
    pub(crate) fn new(value: &'a mut Value, origin: &'a str) -> Node<'a> {
        Node {
            value,
            origin,
            at: KeyPath::default(),
        }
    }

    pub fn value(&self) -> &Value {
        self.value
    }

    /// An error about `rel` below this place (`""`: this place), naming the file and the full
    /// path.
    pub fn error(&self, rel: &str, why: impl std::fmt::Display) -> anyhow::Error {
        match KeyPath::parse(rel) {
            Ok(rel) => self.error_at(&rel, why),
            Err(_) => anyhow!("{}: {} ({rel}): {why}", self.origin, self.at),
        }
    }

    fn error_at(&self, rel: &KeyPath, why: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("{}: {}: {why}", self.origin, self.at.join(rel))
    }

    fn parse(&self, rel: &str) -> Result<KeyPath> {
        KeyPath::parse(rel).map_err(|e| anyhow!("{}: below {}: {e}", self.origin, self.at))
    }

    /// What `rel` names; an error if the config has no such place.
    pub fn get(&self, rel: &str) -> Result<&Value> {
        let rel = self.parse(rel)?;
        path::walk(self.value, &rel).map_err(|(failed, why)| self.error_at(&failed, why))
    }

    /// The string at `rel`.
    pub fn get_str(&self, rel: &str) -> Result<&str> {
        let v = self.get(rel)?;
        v.as_str()
            .ok_or_else(|| self.error(rel, format!("expected a string, found {}", path::kind(v))))
    }

    /// Replaces what `rel` names, which must exist: an edit of something the config has.
    pub fn set(&mut self, rel: &str, value: impl Into<Value>) -> Result<&mut Self> {
        self.change(rel, |parent, last| {
            path::replace(parent, last, value.into()).map(drop)
        })?;
        Ok(self)
    }

    /// Adds field `rel` to an object that exists; the field must not exist yet.
    pub fn insert(&mut self, rel: &str, value: impl Into<Value>) -> Result<&mut Self> {
        self.change(rel, |parent, last| path::insert(parent, last, value.into()))?;
        Ok(self)
    }

    /// Sets field `rel` of an object that exists, whether the field is there or not.
    pub fn upsert(&mut self, rel: &str, value: impl Into<Value>) -> Result<&mut Self> {
        let value = value.into();
        if self.get(rel).is_ok() {
            self.set(rel, value)
        } else {
            self.insert(rel, value)
        }
    }

    /// Takes what `rel` names out of the config; it must exist.
    pub fn remove(&mut self, rel: &str) -> Result<Value> {
        let mut removed = Value::Null;
        self.change(rel, |parent, last| {
            path::remove(parent, last).map(|v| removed = v)
        })?;
        Ok(removed)
    }

    /// Appends to the list that is this place.
    pub fn push(&mut self, value: impl Into<Value>) -> Result<&mut Self> {
        match &mut *self.value {
            Value::Array(items) => items.push(value.into()),
            other => {
                let why = format!("expected a list, found {}", path::kind(other));
                return Err(self.error("", why));
            }
        }
        Ok(self)
    }

    fn change(
        &mut self,
        rel: &str,
        edit: impl FnOnce(&mut Value, &path::Seg) -> Result<(), String>,
    ) -> Result<()> {
        let rel = self.parse(rel)?;
        let (parent_path, last) = rel
            .split_last()
            .ok_or_else(|| self.error_at(&rel, "cannot replace the place itself"))?;
        let parent = match path::walk_mut(self.value, &parent_path) {
            Ok(p) => p,
            Err((failed, why)) => return Err(self.error_at(&failed, why)),
        };
        edit(parent, last).map_err(|why| self.error_at(&rel, why))
    }

    /// The place `rel` below this one, borrowed from it.
    pub fn node(&mut self, rel: &str) -> Result<Node<'_>> {
        Node {
            value: &mut *self.value,
            origin: self.origin,
            at: self.at.clone(),
        }
        .into_node(rel)
    }

    /// The place `rel` below this one, for as long as this one was borrowed.
    pub fn into_node(self, rel: &str) -> Result<Node<'a>> {
        let rel = self.parse(rel)?;
        let at = self.at.join(&rel);
        match path::walk_mut(self.value, &rel) {
            Ok(value) => Ok(Node {
                value,
                origin: self.origin,
                at,
            }),
            Err((failed, why)) => Err(anyhow!("{}: {}: {why}", self.origin, self.at.join(&failed))),
        }
    }
}

/// Declares a typed view: a [`Node`] with named edits of its own, and the generic ones through
/// `Deref`.
macro_rules! view {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name<'a>(pub(crate) $crate::config::Node<'a>);

        impl<'a> std::ops::Deref for $name<'a> {
            type Target = $crate::config::Node<'a>;
            fn deref(&self) -> &Self::Target {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name<'_> {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.0
            }
        }
    };
}
pub(crate) use view;
