//! A Merkle tree over the chunks of a stripe.
//!
//! # Theory
//!
//! Leaves and inner nodes are hashed with different one-byte prefixes, as in
//! RFC 6962 (Certificate Transparency), so that no chunk can be passed off as
//! an inner node or the reverse:
//!
//! ```text
//! leaf(i)    = H(0x00 || i as u32 little-endian || chunk i)
//! node(l, r) = H(0x01 || l || r)
//! ```
//!
//! The chunk's index is in its leaf, so two chunks cannot be swapped. Levels
//! are built pairwise from the leaves; a node without a partner moves up a
//! level unchanged. With 5 chunks:
//!
//! ```text
//!                  root = node(n01_23, L4)
//!              /                          \
//!       n01_23 = node(n01, n23)            L4   (carried up twice)
//!        /             \
//!  n01=node(L0,L1)   n23=node(L2,L3)       L4
//!   /    \            /    \               |
//!  L0    L1          L2    L3              L4
//! ```
//!
//! A proof for one chunk lists the siblings on its path to the root (none
//! where its node is carried up); checking it hashes the chunk and those
//! siblings and compares with the stored root, without the other chunks.

use crate::{Algorithm, ChecksumError, Digest};

const LEAF_PREFIX: u8 = 0x00;
const NODE_PREFIX: u8 = 0x01;

/// The hash of chunk `index`.
pub fn leaf(algorithm: Algorithm, index: usize, chunk: &[u8]) -> Digest {
    let index = u32::try_from(index).expect("a stripe has fewer than 2^32 chunks");
    algorithm.digest_parts(&[&[LEAF_PREFIX], &index.to_le_bytes(), chunk])
}

fn node(algorithm: Algorithm, left: &Digest, right: &Digest) -> Digest {
    algorithm.digest_parts(&[&[NODE_PREFIX], left.as_bytes(), right.as_bytes()])
}

/// A whole tree: every level, leaves first, root last.
#[derive(Clone, Debug)]
pub struct Tree {
    algorithm: Algorithm,
    levels: Vec<Vec<Digest>>,
}

/// The siblings on one chunk's path to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    pub index: usize,
    pub count: usize,
    pub siblings: Vec<Digest>,
}

impl Tree {
    /// Builds the tree over `chunks`.
    pub fn new(algorithm: Algorithm, chunks: &[&[u8]]) -> Result<Tree, ChecksumError> {
        let leaves = chunks.iter().enumerate().map(|(i, c)| leaf(algorithm, i, c)).collect();
        Tree::from_leaves(algorithm, leaves)
    }

    /// Builds the tree over leaf hashes already computed (say, read from a summary block).
    pub fn from_leaves(algorithm: Algorithm, leaves: Vec<Digest>) -> Result<Tree, ChecksumError> {
        if leaves.is_empty() {
            return Err(ChecksumError::NoChunks);
        }
        let mut levels = vec![leaves];
        while levels.last().map_or(0, Vec::len) > 1 {
            let below = levels.last().expect("at least one level");
            let above = below
                .chunks(2)
                .map(|pair| match pair {
                    [left, right] => node(algorithm, left, right),
                    [alone] => *alone,
                    _ => unreachable!("chunks(2) yields one or two"),
                })
                .collect();
            levels.push(above);
        }
        Ok(Tree { algorithm, levels })
    }

    pub fn root(&self) -> Digest {
        self.levels.last().expect("at least one level")[0]
    }

    pub fn leaves(&self) -> &[Digest] {
        &self.levels[0]
    }

    /// The proof that chunk `index` belongs to this tree's root.
    pub fn proof(&self, index: usize) -> Result<Proof, ChecksumError> {
        let count = self.levels[0].len();
        if index >= count {
            return Err(ChecksumError::ProofOutOfRange { index, count });
        }
        let mut siblings = Vec::new();
        let mut position = index;
        for level in &self.levels[..self.levels.len() - 1] {
            let partner = position ^ 1;
            if partner < level.len() {
                siblings.push(level[partner]);
            }
            position /= 2;
        }
        Ok(Proof { index, count, siblings })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

/// Checks that `chunk` is chunk `proof.index` of the tree whose root is `root`.
pub fn verify(algorithm: Algorithm, root: &Digest, chunk: &[u8], proof: &Proof) -> Result<(), ChecksumError> {
    if proof.index >= proof.count {
        return Err(ChecksumError::ProofOutOfRange {
            index: proof.index,
            count: proof.count,
        });
    }
    let mut hash = leaf(algorithm, proof.index, chunk);
    let mut siblings = proof.siblings.iter();
    let (mut position, mut width) = (proof.index, proof.count);
    while width > 1 {
        let partner = position ^ 1;
        if partner < width {
            let Some(sibling) = siblings.next() else {
                return Err(ChecksumError::ProofMismatch { index: proof.index });
            };
            hash = if position % 2 == 0 {
                node(algorithm, &hash, sibling)
            } else {
                node(algorithm, sibling, &hash)
            };
        }
        position /= 2;
        width = width.div_ceil(2);
    }
    if siblings.next().is_some() || hash != *root {
        return Err(ChecksumError::ProofMismatch { index: proof.index });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn chunks(count: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..count)
            .map(|_| (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect())
            .collect()
    }

    #[test]
    fn worked_example_of_five_chunks() {
        let data = chunks(5, 1);
        let refs: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
        let a = Algorithm::Sha256;
        let l: Vec<Digest> = refs.iter().enumerate().map(|(i, c)| leaf(a, i, c)).collect();
        let expected = node(a, &node(a, &node(a, &l[0], &l[1]), &node(a, &l[2], &l[3])), &l[4]);
        assert_eq!(Tree::new(a, &refs).unwrap().root(), expected);
    }

    #[test]
    fn every_proof_verifies_and_any_change_is_caught() {
        for algorithm in Algorithm::ALL {
            for count in 1..=17 {
                let data = chunks(count, count as u64);
                let refs: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
                let tree = Tree::new(algorithm, &refs).unwrap();
                let root = tree.root();
                for (index, chunk) in refs.iter().enumerate() {
                    let proof = tree.proof(index).unwrap();
                    verify(algorithm, &root, chunk, &proof).unwrap();
                    let mut flipped = chunk.to_vec();
                    flipped.push(1);
                    assert_eq!(
                        verify(algorithm, &root, &flipped, &proof),
                        Err(ChecksumError::ProofMismatch { index })
                    );
                    if count > 1 {
                        // A chunk presented at another index fails: indices are in the leaves.
                        let other = (index + 1) % count;
                        let wrong = Proof {
                            index: other,
                            ..tree.proof(other).unwrap()
                        };
                        assert!(verify(algorithm, &root, chunk, &wrong).is_err() || refs[other] == *chunk);
                    }
                }
            }
        }
    }

    #[test]
    fn leaves_and_nodes_are_domain_separated() {
        let a = Algorithm::Blake3;
        let (l0, l1) = (leaf(a, 0, b"x"), leaf(a, 1, b"y"));
        let inner = node(a, &l0, &l1);
        // The bytes of an inner node's input, presented as a chunk, hash differently.
        let forged: Vec<u8> = [l0.as_bytes(), l1.as_bytes()].concat();
        assert_ne!(leaf(a, 0, &forged), inner);
    }

    #[test]
    fn empty_trees_and_bad_indices_are_refused() {
        assert_eq!(Tree::new(Algorithm::Crc32c, &[]).unwrap_err(), ChecksumError::NoChunks);
        let tree = Tree::new(Algorithm::Crc32c, &[b"a", b"b"]).unwrap();
        assert_eq!(
            tree.proof(2).unwrap_err(),
            ChecksumError::ProofOutOfRange { index: 2, count: 2 }
        );
    }
}
