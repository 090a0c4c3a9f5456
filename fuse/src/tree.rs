//! A read-only tree of names built once from relative paths (shard basenames, the original
//! paths of samples). Node 0 is the root directory.

use std::collections::BTreeMap;

/// One node: a directory of named children, or a leaf carrying `L`.
#[derive(Debug)]
pub enum Node<L> {
    /// A directory; children by name, sorted.
    Dir(BTreeMap<String, u32>),
    /// A file.
    Leaf(L),
}

/// The tree.
#[derive(Debug)]
pub struct Tree<L> {
    nodes: Vec<Node<L>>,
}

impl<L> Default for Tree<L> {
    fn default() -> Self {
        Tree {
            nodes: vec![Node::Dir(BTreeMap::new())],
        }
    }
}

impl<L> Tree<L> {
    /// Adds a leaf at `path` (`/`-separated, relative, already checked to hold no `..`, empty or
    /// absolute part). Returns false, changing nothing, if the path or one of its parents is
    /// taken by a node of the other kind or the same leaf path exists.
    pub fn insert(&mut self, path: &str, leaf: L) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        let Some((last, dirs)) = parts.split_last() else {
            return false;
        };
        let mut at = 0u32;
        for part in dirs {
            let next = match &self.nodes[at as usize] {
                Node::Dir(children) => children.get(*part).copied(),
                Node::Leaf(_) => return false,
            };
            at = match next {
                Some(n) if matches!(self.nodes[n as usize], Node::Dir(_)) => n,
                Some(_) => return false,
                None => self.push(at, part, Node::Dir(BTreeMap::new())),
            };
        }
        match &self.nodes[at as usize] {
            Node::Dir(children) if !children.contains_key(*last) => {
                self.push(at, last, Node::Leaf(leaf));
                true
            }
            _ => false,
        }
    }

    fn push(&mut self, parent: u32, name: &str, node: Node<L>) -> u32 {
        let id = self.nodes.len() as u32;
        self.nodes.push(node);
        if let Node::Dir(children) = &mut self.nodes[parent as usize] {
            children.insert(name.to_string(), id);
        }
        id
    }

    /// The node `id`.
    pub fn get(&self, id: u64) -> Option<&Node<L>> {
        usize::try_from(id).ok().and_then(|i| self.nodes.get(i))
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree holds only its root.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_make_directories_and_clashes_are_refused() {
        let mut t = Tree::default();
        assert!(t.insert("cat/1.jpg", 1));
        assert!(t.insert("cat/2.jpg", 2));
        assert!(t.insert("dog/x/3.jpg", 3));
        assert!(!t.insert("cat/1.jpg", 4));
        assert!(!t.insert("cat/1.jpg/y", 5));
        assert!(!t.insert("dog/x", 6));
        assert_eq!(t.len(), 7);
        let Some(Node::Dir(root)) = t.get(0) else {
            panic!("root is a directory")
        };
        assert_eq!(root.keys().collect::<Vec<_>>(), ["cat", "dog"]);
    }
}
