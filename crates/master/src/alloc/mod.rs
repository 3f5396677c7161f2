//! O(1) bin-based offset allocator over a 64-bit region (TLSF / "OffsetAllocator" style).
//!
//! Free extents are kept in 496 size bins. A size maps to a bin with a small-float encoding
//! (3 mantissa bits): sizes below 8 get exact bins, larger sizes share a bin with everything up to
//! 12.5% bigger. A two-level bitmap (64-bit top mask over exponents, 8-bit leaf masks over
//! mantissas) finds the smallest non-empty bin that is large enough with a few bit operations.
//! Every extent (used or free) is a 32-byte node in a `Vec` (its size read from the next node's
//! offset), linked to its address neighbours so that a free merges with adjacent free extents in
//! O(1), and free nodes are linked into intrusive per-bin lists.
//!
//! An allocation consumes the *bin size* of its rounded-up request rather than the exact request:
//! a freed block then lands back in the bin where the same request is looked up, so uniform-size
//! workloads do not fragment. Slack (consumed − requested) is accounted exactly.
//!
//! The allocator is not internally synchronised; callers wrap it in a mutex.

/// Mantissa bits of the small-float size encoding.
const MANTISSA_BITS: u32 = 3;
/// Sizes below this value have exact bins.
const MANTISSA_VALUE: u64 = 1 << MANTISSA_BITS;
/// Mask selecting the mantissa of a bin index.
const MANTISSA_MASK: u64 = MANTISSA_VALUE - 1;
/// Number of bins: the bin of `u64::MAX` is 61 << 3 | 7 = 495, the last one whose size fits a u64.
const NUM_BINS: usize = 496;
/// Leaf masks indexed by the exponent part of a bin (62 used, 64 so any `u64` bit index fits).
const NUM_TOP_BINS: usize = 64;
/// Sentinel for "no node" in the intrusive lists.
const NIL: u32 = u32::MAX;
/// How many nodes of the round-down bin the fallback path inspects (bounds its cost).
const FALLBACK_SCAN_LIMIT: usize = 32;

/// Bin whose size is the largest bin size `<= size` (the bin a free extent of `size` is filed under).
fn bin_round_down(size: u64) -> u32 {
    if size < MANTISSA_VALUE {
        // Exact bins for tiny sizes; the cast cannot truncate.
        return size as u32;
    }
    let msb = 63 - size.leading_zeros();
    let shift = msb - MANTISSA_BITS;
    let exp = shift + 1;
    let mantissa = ((size >> shift) & MANTISSA_MASK) as u32;
    (exp << MANTISSA_BITS) | mantissa
}

/// Smallest bin whose size is `>= size`; `None` when `size` exceeds the largest bin size.
fn bin_round_up(size: u64) -> Option<u32> {
    let down = bin_round_down(size);
    if bin_size(down) == size {
        Some(down)
    } else if (down as usize) + 1 < NUM_BINS {
        Some(down + 1)
    } else {
        None
    }
}

/// Size represented by a bin index (`bin < NUM_BINS`; larger indices would not fit a u64).
fn bin_size(bin: u32) -> u64 {
    let exp = bin >> MANTISSA_BITS;
    let mantissa = u64::from(bin) & MANTISSA_MASK;
    if exp == 0 { mantissa } else { (mantissa | MANTISSA_VALUE) << (exp - 1) }
}

/// `bin_size` that is `None` for indices past the last representable bin.
fn bin_size_checked(bin: u32) -> Option<u64> {
    if (bin as usize) < NUM_BINS { Some(bin_size(bin)) } else { None }
}

/// Errors returned by [`OffsetAllocator`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A zero-byte allocation was requested.
    #[error("zero-size allocation")]
    ZeroSize,
    /// An allocator over an empty region was requested.
    #[error("allocator capacity must be greater than zero")]
    ZeroCapacity,
    /// The request is larger than the whole region.
    #[error("requested {requested} bytes exceeds capacity {capacity}")]
    TooLarge {
        /// Requested size in bytes.
        requested: u64,
        /// Region capacity in bytes.
        capacity: u64,
    },
    /// No free extent can hold the request.
    #[error("no space for {requested} bytes (largest free extent {largest_free})")]
    NoSpace {
        /// Requested size in bytes.
        requested: u64,
        /// Size of the largest free extent at the time of the failure.
        largest_free: u64,
    },
    /// The handle is stale, double-freed or belongs to another allocator.
    #[error("invalid or stale allocation handle")]
    InvalidHandle,
    /// A snapshot failed validation; nothing was built.
    #[error("corrupt allocator snapshot: {0}")]
    CorruptSnapshot(String),
}

/// Handle to a live allocation; small and `Copy` so callers can store it in metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    offset: u64,
    size: u64,
    node: u32,
    generation: u32,
}

impl Allocation {
    /// Byte offset of the allocation within the region.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Requested size in bytes (the descriptor size, not the consumed size).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The allocator's slot for it: dense, unique among the allocator's live allocations, reused after a free
    /// (what per-allocation side tables index by).
    pub fn slot(&self) -> u32 {
        self.node
    }
}

/// One live allocation in an [`AllocatorSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotAllocation {
    /// Byte offset within the region.
    pub offset: u64,
    /// Bytes the allocation occupies (requested + slack).
    pub consumed: u64,
    /// Bytes the caller asked for.
    pub requested: u64,
}

/// Image of an allocator: its capacity and live allocations sorted by offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorSnapshot {
    /// Region capacity in bytes.
    pub capacity: u64,
    /// Live allocations, sorted strictly by offset.
    pub allocations: Vec<SnapshotAllocation>,
}

/// The used flag in `Node::tag`; the bits below it are the generation.
const USED: u32 = 1 << 31;
/// The generation bits of `Node::tag`.
const GENERATION: u32 = USED - 1;

/// One extent of the region, used or free: 32 bytes, one per allocation, so it is kept small. Its size is not
/// stored: it runs to the next extent's offset (or the region's end).
#[derive(Clone, Copy, Debug)]
struct Node {
    offset: u64,
    /// Used: the requested bytes. Free: the bin list's links (previous in the low half, next in the high half).
    /// A node is never both, so they share the word.
    word: u64,
    neighbor_prev: u32,
    neighbor_next: u32,
    /// The generation (bumped every time the slot becomes a live allocation, so stale handles are detected) and,
    /// in the top bit, whether the extent is a live allocation.
    tag: u32,
}

impl Node {
    /// A detached free node that keeps the slot's generation.
    fn blank(generation: u32) -> Self {
        Node {
            offset: 0,
            word: Self::links(NIL, NIL),
            neighbor_prev: NIL,
            neighbor_next: NIL,
            tag: generation & GENERATION,
        }
    }

    fn links(prev: u32, next: u32) -> u64 {
        u64::from(prev) | (u64::from(next) << 32)
    }

    fn used(&self) -> bool {
        self.tag & USED != 0
    }

    fn generation(&self) -> u32 {
        self.tag & GENERATION
    }

    /// Requested bytes; 0 for free nodes.
    fn requested(&self) -> u64 {
        if self.used() { self.word } else { 0 }
    }

    fn bin_prev(&self) -> u32 {
        self.word as u32
    }

    fn bin_next(&self) -> u32 {
        (self.word >> 32) as u32
    }

    fn set_bin_prev(&mut self, prev: u32) {
        self.word = Self::links(prev, self.bin_next());
    }

    fn set_bin_next(&mut self, next: u32) {
        self.word = Self::links(self.bin_prev(), next);
    }

    /// Makes the node a live allocation of `requested` bytes under a new generation.
    fn take(&mut self, requested: u64) {
        self.tag = USED | (self.generation().wrapping_add(1) & GENERATION);
        self.word = requested;
    }

    /// Makes the node free, unlinked from any bin; the generation stays for stale-handle detection.
    fn release(&mut self) {
        self.tag &= GENERATION;
        self.word = Self::links(NIL, NIL);
    }
}

/// O(1) offset allocator over `[0, capacity)`; not internally synchronised (wrap it in a mutex).
#[derive(Clone)]
pub struct OffsetAllocator {
    capacity: u64,
    /// Bit `t` set when any bin with exponent `t` is non-empty.
    top_mask: u64,
    /// Bit `m` of `leaf_masks[t]` set when bin `t << 3 | m` is non-empty.
    leaf_masks: [u8; NUM_TOP_BINS],
    /// Head node of each bin's free list.
    bin_heads: [u32; NUM_BINS],
    nodes: Vec<Node>,
    /// Recycled node slots (a stack, so hot slots are reused first).
    free_slots: Vec<u32>,
    /// Generation given to brand-new slots: above every generation handed out before the last compaction, so
    /// handles from before it can never match a new node.
    gen_floor: u32,
    /// Node at offset 0 (start of the address-ordered neighbour list).
    first: u32,
    used_bytes: u64,
    consumed_bytes: u64,
    live: u64,
    total: u64,
}

impl std::fmt::Debug for OffsetAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bin tables are large and rarely useful in logs; show the accounting only.
        f.debug_struct("OffsetAllocator")
            .field("capacity", &self.capacity)
            .field("used_bytes", &self.used_bytes)
            .field("consumed_bytes", &self.consumed_bytes)
            .field("live", &self.live)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl OffsetAllocator {
    /// Creates an allocator managing `capacity` bytes, all free.
    pub fn new(capacity: u64) -> Result<Self, AllocError> {
        if capacity == 0 {
            return Err(AllocError::ZeroCapacity);
        }
        let mut this = Self::empty(capacity);
        this.nodes.push(Node::blank(0));
        this.first = 0;
        this.bin_insert(0);
        Ok(this)
    }

    /// An allocator with no nodes at all (callers add them).
    fn empty(capacity: u64) -> Self {
        OffsetAllocator {
            capacity,
            top_mask: 0,
            leaf_masks: [0; NUM_TOP_BINS],
            bin_heads: [NIL; NUM_BINS],
            nodes: Vec::new(),
            free_slots: Vec::new(),
            gen_floor: 0,
            first: NIL,
            used_bytes: 0,
            consumed_bytes: 0,
            live: 0,
            total: 0,
        }
    }

    /// Allocates `size` bytes; the allocation consumes `normalized_size(size)` bytes on the normal path.
    pub fn allocate(&mut self, size: u64) -> Result<Allocation, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if size > self.capacity {
            return Err(AllocError::TooLarge { requested: size, capacity: self.capacity });
        }
        let Some(highest) = self.highest_bin() else {
            return Err(AllocError::NoSpace { requested: size, largest_free: 0 });
        };
        // Fast fail: every extent in the highest bin is below the next bin's size.
        let highest_max = bin_size_checked(highest + 1).map_or(u64::MAX, |s| s - 1);
        if highest_max < size {
            return Err(self.no_space(size));
        }
        let round_up = bin_round_up(size);
        let (index, consumed) = match round_up.and_then(|b| self.first_bin_at_least(b)) {
            Some(bin) => (self.bin_heads[bin as usize], round_up.map_or(size, bin_size)),
            None => match self.fallback_candidate(size) {
                // The candidate is below the rounded size (else the main path would have found
                // it), so it is consumed whole; min() keeps that true even if it were not.
                Some(index) => {
                    let rounded = round_up.map_or(u64::MAX, bin_size);
                    (index, rounded.min(self.extent_size(index)))
                }
                None => return Err(self.no_space(size)),
            },
        };
        let remainder = self.extent_size(index) - consumed;
        // Reserve the remainder's slot before mutating so a failure leaves no trace.
        if remainder > 0 && self.free_slots.is_empty() && self.nodes.len() >= NIL as usize {
            return Err(self.no_space(size));
        }

        self.bin_remove(index);
        let (offset, next, generation) = {
            let node = &mut self.nodes[index as usize];
            node.take(size);
            (node.offset, node.neighbor_next, node.generation())
        };
        if remainder > 0 {
            let rest = self.take_slot(Node {
                offset: offset + consumed,
                neighbor_prev: index,
                neighbor_next: next,
                ..Node::blank(0)
            });
            if next != NIL {
                self.nodes[next as usize].neighbor_prev = rest;
            }
            self.nodes[index as usize].neighbor_next = rest;
            self.bin_insert(rest);
        }

        self.used_bytes += size;
        self.consumed_bytes += consumed;
        self.live += 1;
        self.total += 1;
        Ok(Allocation { offset, size, node: index, generation })
    }

    /// Frees a live allocation, merging it with free neighbours; invalid handles change nothing.
    pub fn free(&mut self, a: &Allocation) -> Result<(), AllocError> {
        let Some(node) = self.live_node(a) else {
            return Err(AllocError::InvalidHandle);
        };
        self.used_bytes -= node.requested();
        self.consumed_bytes -= self.extent_size(a.node);
        self.live -= 1;

        let mut merged = a.node;
        self.nodes[merged as usize].release();
        // Merge into the left neighbour so the node at offset 0 keeps its slot.
        let left = self.nodes[merged as usize].neighbor_prev;
        if left != NIL && !self.nodes[left as usize].used() {
            self.bin_remove(left);
            let next = self.nodes[merged as usize].neighbor_next;
            self.nodes[left as usize].neighbor_next = next;
            if next != NIL {
                self.nodes[next as usize].neighbor_prev = left;
            }
            self.release_slot(merged);
            merged = left;
        }
        let right = self.nodes[merged as usize].neighbor_next;
        if right != NIL && !self.nodes[right as usize].used() {
            self.bin_remove(right);
            let next = self.nodes[right as usize].neighbor_next;
            self.nodes[merged as usize].neighbor_next = next;
            if next != NIL {
                self.nodes[next as usize].neighbor_prev = merged;
            }
            self.release_slot(right);
        }
        // Head insertion: an immediate re-allocation of the same size finds this extent first.
        self.bin_insert(merged);
        self.compact_if_empty();
        Ok(())
    }

    /// O(1) check: true only if `allocate(size)` would succeed; never false for sizes the main path places.
    pub fn can_fit(&self, size: u64) -> bool {
        if size == 0 || size > self.capacity {
            return false;
        }
        if let Some(bin) = bin_round_up(size)
            && self.first_bin_at_least(bin).is_some()
        {
            return true;
        }
        // The fallback path looks at the head of the round-down bin first; checking it keeps this O(1).
        let head = self.bin_heads[bin_round_down(size) as usize];
        head != NIL && self.extent_size(head) >= size
    }

    /// Bytes consumed by a live allocation, or `None` if the handle is stale.
    pub fn consumed(&self, a: &Allocation) -> Option<u64> {
        self.live_node(a).map(|_| self.extent_size(a.node))
    }

    /// Region size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Sum of requested sizes of live allocations.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Sum of (consumed − requested) over live allocations.
    pub fn slack_bytes(&self) -> u64 {
        self.consumed_bytes - self.used_bytes
    }

    /// Bytes held by live allocations including slack.
    pub fn consumed_bytes(&self) -> u64 {
        self.consumed_bytes
    }

    /// Bytes not held by any allocation (`capacity − consumed_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.capacity - self.consumed_bytes
    }

    /// Number of live allocations.
    pub fn live_allocations(&self) -> u64 {
        self.live
    }

    /// Monotonic count of successful allocations (restored allocations count once).
    pub fn allocations_total(&self) -> u64 {
        self.total
    }

    /// Exact size of the largest free extent (scans one bin's list).
    pub fn largest_free_extent(&self) -> u64 {
        let Some(bin) = self.highest_bin() else {
            return 0;
        };
        let mut best = 0;
        let mut cursor = self.bin_heads[bin as usize];
        while cursor != NIL {
            best = best.max(self.extent_size(cursor));
            cursor = self.nodes[cursor as usize].bin_next();
        }
        best
    }

    /// Bytes an allocation of `size` consumes on the normal path; `None` for 0 or beyond the largest bin.
    pub fn normalized_size(size: u64) -> Option<u64> {
        if size == 0 { None } else { bin_round_up(size).map(bin_size) }
    }

    /// Live allocations in address order.
    pub fn snapshot(&self) -> AllocatorSnapshot {
        let mut allocations = Vec::with_capacity(usize::try_from(self.live).unwrap_or(0));
        let mut cursor = self.first;
        while cursor != NIL {
            let node = &self.nodes[cursor as usize];
            if node.used() {
                allocations.push(SnapshotAllocation {
                    offset: node.offset,
                    consumed: self.extent_size(cursor),
                    requested: node.requested(),
                });
            }
            cursor = node.neighbor_next;
        }
        AllocatorSnapshot { capacity: self.capacity, allocations }
    }

    /// Rebuilds an allocator from a snapshot, returning the live handles in snapshot order.
    ///
    /// The whole snapshot is validated before anything is built. Handles issued by the allocator the snapshot
    /// was taken from are not meaningful for the restored one; use the returned handles.
    pub fn restore(s: &AllocatorSnapshot) -> Result<(Self, Vec<Allocation>), AllocError> {
        validate_snapshot(s)?;

        let mut this = Self::empty(s.capacity);
        // Every node sized in at once (one per allocation and per gap): pushing them one by one grew the vector
        // by doubling, copying a region's millions of nodes into fresh memory each time (most of a large
        // restore's allocator work, measured).
        let (mut gap_count, mut cursor) = (0usize, 0u64);
        for a in &s.allocations {
            gap_count += usize::from(a.offset > cursor);
            cursor = a.offset + a.consumed;
        }
        gap_count += usize::from(cursor < s.capacity);
        this.nodes.reserve_exact(s.allocations.len() + gap_count);
        let mut handles = Vec::with_capacity(s.allocations.len());
        let mut cursor = 0u64;
        // Builds nodes left to right; `push` links each to the previous one.
        let mut prev = NIL;
        let mut push = |this: &mut Self, node: Node| -> u32 {
            // Validation bounded the node count below NIL, so the index fits.
            let index = this.nodes.len() as u32;
            let mut node = node;
            node.neighbor_prev = prev;
            this.nodes.push(node);
            if prev == NIL {
                this.first = index;
            } else {
                this.nodes[prev as usize].neighbor_next = index;
            }
            prev = index;
            index
        };
        // A node's size runs to the next node's offset: gaps are binned once every node is linked.
        let mut gaps = Vec::with_capacity(gap_count);
        for a in &s.allocations {
            if a.offset > cursor {
                let mut gap = Node::blank(0);
                gap.offset = cursor;
                gaps.push(push(&mut this, gap));
            }
            let mut used = Node::blank(0);
            used.offset = a.offset;
            used.take(a.requested);
            let index = push(&mut this, used);
            handles.push(Allocation { offset: a.offset, size: a.requested, node: index, generation: 1 });
            this.used_bytes += a.requested;
            this.consumed_bytes += a.consumed;
            cursor = a.offset + a.consumed;
        }
        if cursor < s.capacity {
            let mut gap = Node::blank(0);
            gap.offset = cursor;
            gaps.push(push(&mut this, gap));
        }
        for gap in gaps {
            this.bin_insert(gap);
        }
        this.live = handles.len() as u64;
        this.total = this.live;
        Ok((this, handles))
    }

    /// Checks every structural invariant (O(n)); a debugging and testing aid.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut cursor = self.first;
        let mut prev = NIL;
        let mut expected_offset = 0u64;
        let mut used = 0u64;
        let mut consumed = 0u64;
        let mut live = 0u64;
        let mut free_nodes = 0usize;
        let mut prev_free = false;
        let mut steps = 0usize;
        while cursor != NIL {
            steps += 1;
            if steps > self.nodes.len() {
                return Err("neighbour list has a cycle".into());
            }
            let node = self.nodes.get(cursor as usize).ok_or("neighbour index out of range")?;
            if node.neighbor_prev != prev {
                return Err(format!("node {cursor}: bad neighbor_prev"));
            }
            let end = match self.nodes.get(node.neighbor_next as usize) {
                Some(next) if node.neighbor_next != NIL => next.offset,
                _ => self.capacity,
            };
            let size = end.saturating_sub(node.offset);
            if node.offset != expected_offset || size == 0 {
                return Err(format!("node {cursor}: offset {} size {size} breaks tiling", node.offset));
            }
            if node.used() {
                if node.requested() == 0 || node.requested() > size {
                    return Err(format!("node {cursor}: requested {} consumed {size}", node.requested()));
                }
                used += node.requested();
                consumed += size;
                live += 1;
                prev_free = false;
            } else {
                if prev_free {
                    return Err(format!("node {cursor}: adjacent free nodes not merged"));
                }
                prev_free = true;
                free_nodes += 1;
            }
            expected_offset = end;
            prev = cursor;
            cursor = node.neighbor_next;
        }
        if expected_offset != self.capacity {
            return Err(format!("nodes cover {expected_offset} of {}", self.capacity));
        }
        if used != self.used_bytes || consumed != self.consumed_bytes || live != self.live {
            return Err("accounting mismatch".into());
        }
        let mut binned = 0usize;
        for bin in 0..NUM_BINS {
            let bit = self.leaf_masks[bin >> MANTISSA_BITS] & (1 << (bin & 7)) != 0;
            if bit != (self.bin_heads[bin] != NIL) {
                return Err(format!("bin {bin}: leaf bit disagrees with list"));
            }
            let mut cursor = self.bin_heads[bin];
            let mut prev = NIL;
            while cursor != NIL {
                binned += 1;
                if binned > self.nodes.len() {
                    return Err("bin list has a cycle".into());
                }
                let node = self.nodes.get(cursor as usize).ok_or("bin index out of range")?;
                if node.used() || bin_round_down(self.extent_size(cursor)) as usize != bin || node.bin_prev() != prev {
                    return Err(format!("node {cursor}: wrong bin {bin} or links"));
                }
                prev = cursor;
                cursor = node.bin_next();
            }
        }
        for top in 0..NUM_TOP_BINS {
            if (self.top_mask >> top & 1 != 0) != (self.leaf_masks[top] != 0) {
                return Err(format!("top bit {top} disagrees with leaf mask"));
            }
        }
        if binned != free_nodes {
            return Err(format!("{binned} binned nodes, {free_nodes} free nodes"));
        }
        if self.nodes.len() != steps + self.free_slots.len() {
            return Err("node slots leaked".into());
        }
        Ok(())
    }

    /// Bytes node `index` covers: up to the next node's offset, or the region's end.
    fn extent_size(&self, index: u32) -> u64 {
        let node = &self.nodes[index as usize];
        let end =
            if node.neighbor_next == NIL { self.capacity } else { self.nodes[node.neighbor_next as usize].offset };
        end - node.offset
    }

    /// The node behind a handle if the handle is live and matches it exactly.
    fn live_node(&self, a: &Allocation) -> Option<&Node> {
        self.nodes
            .get(a.node as usize)
            .filter(|n| n.used() && n.generation() == a.generation && n.offset == a.offset && n.requested() == a.size)
    }

    /// `NoSpace` with the exact largest free extent (only computed on failure).
    fn no_space(&self, size: u64) -> AllocError {
        AllocError::NoSpace { requested: size, largest_free: self.largest_free_extent() }
    }

    /// Highest non-empty bin.
    fn highest_bin(&self) -> Option<u32> {
        if self.top_mask == 0 {
            return None;
        }
        let top = 63 - self.top_mask.leading_zeros();
        let leaf = 7 - self.leaf_masks[top as usize].leading_zeros();
        Some((top << MANTISSA_BITS) | leaf)
    }

    /// Smallest non-empty bin `>= bin`: same exponent first, then the next exponents.
    fn first_bin_at_least(&self, bin: u32) -> Option<u32> {
        let top = bin >> MANTISSA_BITS;
        let leaf = bin & 7;
        let leaves = self.leaf_masks[top as usize] & (0xFFu8 << leaf);
        if leaves != 0 {
            return Some((top << MANTISSA_BITS) | leaves.trailing_zeros());
        }
        let tops = self.top_mask & u64::MAX.checked_shl(top + 1).unwrap_or(0);
        if tops == 0 {
            return None;
        }
        let top = tops.trailing_zeros();
        Some((top << MANTISSA_BITS) | self.leaf_masks[top as usize].trailing_zeros())
    }

    /// Fallback: a node of the round-down bin that still holds `size`, looking at a bounded prefix.
    fn fallback_candidate(&self, size: u64) -> Option<u32> {
        let mut cursor = self.bin_heads[bin_round_down(size) as usize];
        for _ in 0..FALLBACK_SCAN_LIMIT {
            if cursor == NIL {
                return None;
            }
            if self.extent_size(cursor) >= size {
                return Some(cursor);
            }
            cursor = self.nodes[cursor as usize].bin_next();
        }
        None
    }

    /// Pushes a free node at the head of its bin list and marks the bin non-empty.
    fn bin_insert(&mut self, index: u32) {
        let bin = bin_round_down(self.extent_size(index)) as usize;
        let head = self.bin_heads[bin];
        self.nodes[index as usize].word = Node::links(NIL, head);
        if head != NIL {
            self.nodes[head as usize].set_bin_prev(index);
        }
        self.bin_heads[bin] = index;
        self.leaf_masks[bin >> MANTISSA_BITS] |= 1 << (bin & 7);
        self.top_mask |= 1 << (bin >> MANTISSA_BITS);
    }

    /// Unlinks a free node from its bin list, clearing bitmap bits when the bin empties.
    fn bin_remove(&mut self, index: u32) {
        let size = self.extent_size(index);
        let (prev, next) = {
            let node = &mut self.nodes[index as usize];
            let links = (node.bin_prev(), node.bin_next());
            node.word = Node::links(NIL, NIL);
            links
        };
        if prev != NIL {
            self.nodes[prev as usize].set_bin_next(next);
        } else {
            let bin = bin_round_down(size) as usize;
            self.bin_heads[bin] = next;
            if next == NIL {
                let top = bin >> MANTISSA_BITS;
                self.leaf_masks[top] &= !(1 << (bin & 7));
                if self.leaf_masks[top] == 0 {
                    self.top_mask &= !(1 << top);
                }
            }
        }
        if next != NIL {
            self.nodes[next as usize].set_bin_prev(prev);
        }
    }

    /// Stores `node` in a recycled slot (keeping the slot's generation) or a new one; the caller checked
    /// that a slot is available.
    fn take_slot(&mut self, mut node: Node) -> u32 {
        if let Some(index) = self.free_slots.pop() {
            let slot = &mut self.nodes[index as usize];
            node.tag = (node.tag & USED) | slot.generation();
            *slot = node;
            index
        } else {
            let index = self.nodes.len() as u32;
            node.tag = (node.tag & USED) | (self.gen_floor & GENERATION);
            self.nodes.push(node);
            index
        }
    }

    /// When the last allocation is freed, drops the node storage grown by past allocations so an emptied
    /// region returns its metadata memory (a master that evicted or removed everything shrinks back).
    fn compact_if_empty(&mut self) {
        const KEEP: usize = 64;
        if self.live != 0 || self.nodes.len() <= KEEP {
            return;
        }
        let floor = self.nodes.iter().map(Node::generation).max().unwrap_or(0).wrapping_add(1) & GENERATION;
        let total = self.total;
        let mut fresh = Self::empty(self.capacity);
        fresh.gen_floor = floor;
        fresh.nodes.push(Node::blank(floor));
        fresh.first = 0;
        fresh.bin_insert(0);
        fresh.total = total;
        *self = fresh;
    }

    /// Returns a merged-away slot to the free stack. Its contents are dead (`used` is already false and
    /// the generation survives for stale-handle detection); `take_slot` overwrites them.
    fn release_slot(&mut self, index: u32) {
        self.free_slots.push(index);
    }
}

/// Validates a whole snapshot before anything is built.
fn validate_snapshot(s: &AllocatorSnapshot) -> Result<(), AllocError> {
    let corrupt = |msg: String| Err(AllocError::CorruptSnapshot(msg));
    if s.capacity == 0 {
        return corrupt("capacity is zero".into());
    }
    // Each allocation needs a node and may need a gap node before it, plus the tail gap.
    let max_nodes = s.allocations.len().checked_mul(2).and_then(|n| n.checked_add(1));
    if max_nodes.is_none_or(|n| n >= NIL as usize) {
        return corrupt(format!("too many allocations ({})", s.allocations.len()));
    }
    let mut end_of_previous = 0u64;
    for (i, a) in s.allocations.iter().enumerate() {
        if a.requested == 0 {
            return corrupt(format!("allocation {i}: requested size is zero"));
        }
        if a.requested > a.consumed {
            return corrupt(format!("allocation {i}: requested {} > consumed {}", a.requested, a.consumed));
        }
        if i > 0 && a.offset < end_of_previous {
            return corrupt(format!("allocation {i}: offset {} unsorted or overlapping", a.offset));
        }
        let Some(end) = a.offset.checked_add(a.consumed) else {
            return corrupt(format!("allocation {i}: offset + consumed overflows"));
        };
        if end > s.capacity {
            return corrupt(format!("allocation {i}: ends at {end} beyond capacity {}", s.capacity));
        }
        end_of_previous = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;

    fn check(a: &OffsetAllocator) {
        a.check_invariants().unwrap();
        assert_eq!(a.used_bytes() + a.slack_bytes() + a.free_bytes(), a.capacity());
    }

    #[test]
    fn alloc_bin_math_small_sizes_are_exact() {
        for size in 0..8u64 {
            assert_eq!(bin_round_down(size), size as u32);
            assert_eq!(bin_round_up(size), Some(size as u32));
            assert_eq!(bin_size(size as u32), size);
        }
        // 8..16 are also exact (mantissa covers them fully).
        for size in 8..16u64 {
            assert_eq!(bin_size(bin_round_down(size)), size);
        }
    }

    #[test]
    fn alloc_bin_math_round_trips_every_bin() {
        for bin in 0..NUM_BINS as u32 {
            let size = bin_size(bin);
            assert_eq!(bin_round_down(size), bin, "bin {bin}");
            assert_eq!(bin_round_up(size), Some(bin), "bin {bin}");
            if bin > 0 {
                assert!(bin_size(bin - 1) < size, "bin sizes strictly increase at {bin}");
            }
        }
        assert_eq!(bin_round_down(u64::MAX), (NUM_BINS - 1) as u32);
        assert_eq!(bin_size((NUM_BINS - 1) as u32), 15 << 60);
        assert_eq!(bin_size_checked(NUM_BINS as u32), None);
    }

    #[test]
    fn alloc_bin_math_rounding_is_tight() {
        let mut sizes: Vec<u64> = (1..5000).collect();
        for shift in 3..64 {
            let p = 1u64 << shift;
            sizes.extend([p - 1, p, p + 1, p + p / 8, p + p / 8 - 1, p + p / 8 + 1]);
        }
        sizes.extend([u64::MAX, u64::MAX - 1, (15 << 60) - 1, 15 << 60, (15 << 60) + 1]);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sizes.push(x >> (x % 64));
        }
        for &size in sizes.iter().filter(|&&s| s > 0) {
            let down = bin_round_down(size);
            assert!(bin_size(down) <= size);
            if let Some(next) = bin_size_checked(down + 1) {
                assert!(next > size, "round_down not the largest for {size}");
            }
            match bin_round_up(size) {
                Some(up) => {
                    let rounded = bin_size(up);
                    assert!(rounded >= size);
                    if up > 0 {
                        assert!(bin_size(up - 1) < size, "round_up not the smallest for {size}");
                    }
                    if size >= 8 {
                        // Waste below 12.5% of the request.
                        assert!((rounded - size) * 8 < size, "waste too large for {size}");
                    }
                    assert_eq!(OffsetAllocator::normalized_size(size), Some(rounded));
                }
                None => assert!(size > 15 << 60),
            }
        }
        assert_eq!(OffsetAllocator::normalized_size(0), None);
        assert_eq!(OffsetAllocator::normalized_size(576 * KIB), Some(576 * KIB));
        assert_eq!(OffsetAllocator::normalized_size(4608 * KIB), Some(4608 * KIB));
    }

    #[test]
    fn alloc_handle_is_small() {
        assert_eq!(std::mem::size_of::<Allocation>(), 24);
        // One node per allocation: its size is part of every object's cost.
        assert_eq!(std::mem::size_of::<Node>(), 32);
    }

    #[test]
    fn alloc_rejects_zero_sizes() {
        assert_eq!(OffsetAllocator::new(0).unwrap_err(), AllocError::ZeroCapacity);
        let mut a = OffsetAllocator::new(100).unwrap();
        assert_eq!(a.allocate(0), Err(AllocError::ZeroSize));
        assert_eq!(a.allocate(101), Err(AllocError::TooLarge { requested: 101, capacity: 100 }));
        assert!(!a.can_fit(0));
        assert!(!a.can_fit(101));
    }

    #[test]
    fn alloc_basic_accounting() {
        let mut a = OffsetAllocator::new(GIB).unwrap();
        let x = a.allocate(1000).unwrap();
        assert_eq!(x.offset(), 0);
        assert_eq!(x.size(), 1000);
        assert_eq!(a.consumed(&x), Some(1024));
        assert_eq!(a.used_bytes(), 1000);
        assert_eq!(a.slack_bytes(), 24);
        assert_eq!(a.consumed_bytes(), 1024);
        assert_eq!(a.free_bytes(), GIB - 1024);
        let y = a.allocate(7).unwrap();
        assert_eq!(y.offset(), 1024);
        assert_eq!(a.live_allocations(), 2);
        assert_eq!(a.allocations_total(), 2);
        check(&a);
        a.free(&x).unwrap();
        a.free(&y).unwrap();
        assert_eq!(a.live_allocations(), 0);
        assert_eq!(a.allocations_total(), 2);
        assert_eq!(a.free_bytes(), GIB);
        assert_eq!(a.largest_free_extent(), GIB);
        check(&a);
    }

    #[test]
    fn alloc_fast_fail_and_no_space() {
        let mut a = OffsetAllocator::new(1000).unwrap();
        let x = a.allocate(600).unwrap();
        // 400 bytes remain; 500 cannot fit and the top bin proves it without searching.
        assert_eq!(a.largest_free_extent(), 1000 - a.consumed(&x).unwrap());
        let err = a.allocate(500).unwrap_err();
        assert_eq!(err, AllocError::NoSpace { requested: 500, largest_free: a.largest_free_extent() });
        assert!(!a.can_fit(500));
        check(&a);
        // Fill everything, then any request fails with largest_free 0.
        let rest = a.largest_free_extent();
        let y = a.allocate(rest).unwrap();
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.allocate(1), Err(AllocError::NoSpace { requested: 1, largest_free: 0 }));
        a.free(&y).unwrap();
        a.free(&x).unwrap();
        check(&a);
    }

    #[test]
    fn alloc_double_free_rejected_without_mutation() {
        let mut a = OffsetAllocator::new(MIB).unwrap();
        let x = a.allocate(4096).unwrap();
        let y = a.allocate(4096).unwrap();
        a.free(&x).unwrap();
        let before = a.snapshot();
        let stats = (a.used_bytes(), a.consumed_bytes(), a.live_allocations(), a.largest_free_extent());
        assert_eq!(a.free(&x), Err(AllocError::InvalidHandle));
        assert_eq!(a.snapshot(), before);
        assert_eq!(stats, (a.used_bytes(), a.consumed_bytes(), a.live_allocations(), a.largest_free_extent()));
        // Slot reuse: the same offset again must not accept the old handle.
        let z = a.allocate(4096).unwrap();
        assert_eq!(z.offset(), x.offset());
        assert_eq!(a.free(&x), Err(AllocError::InvalidHandle));
        assert_eq!(a.consumed(&x), None);
        // Forged handles.
        let mut forged = y;
        forged.offset += 1;
        assert_eq!(a.free(&forged), Err(AllocError::InvalidHandle));
        let mut forged = y;
        forged.node = 9999;
        assert_eq!(a.free(&forged), Err(AllocError::InvalidHandle));
        let mut forged = y;
        forged.size = 1;
        assert_eq!(a.free(&forged), Err(AllocError::InvalidHandle));
        check(&a);
        a.free(&y).unwrap();
        a.free(&z).unwrap();
        assert_eq!(a.free(&z), Err(AllocError::InvalidHandle));
        check(&a);
        assert_eq!(a.largest_free_extent(), MIB);
    }

    #[test]
    fn alloc_capacity_one() {
        let mut a = OffsetAllocator::new(1).unwrap();
        let x = a.allocate(1).unwrap();
        assert_eq!(a.allocate(1), Err(AllocError::NoSpace { requested: 1, largest_free: 0 }));
        a.free(&x).unwrap();
        let x = a.allocate(1).unwrap();
        assert_eq!(x.offset(), 0);
        check(&a);
    }

    #[test]
    fn alloc_capacity_u64_max() {
        let mut a = OffsetAllocator::new(u64::MAX).unwrap();
        assert_eq!(a.largest_free_extent(), u64::MAX);
        let x = a.allocate(1 << 62).unwrap();
        let y = a.allocate(u64::MAX / 2).unwrap();
        let z = a.allocate(3).unwrap();
        check(&a);
        a.free(&y).unwrap();
        a.free(&x).unwrap();
        a.free(&z).unwrap();
        check(&a);
        assert_eq!(a.largest_free_extent(), u64::MAX);
        // Beyond the largest bin size only the fallback path can place it.
        let full = a.allocate(u64::MAX).unwrap();
        assert_eq!(a.consumed(&full), Some(u64::MAX));
        assert_eq!(a.free_bytes(), 0);
        assert!(!a.can_fit(1));
        a.free(&full).unwrap();
        assert!(a.can_fit(u64::MAX));
        let near = a.allocate(u64::MAX - 5).unwrap();
        assert_eq!(a.consumed(&near), Some(u64::MAX));
        a.free(&near).unwrap();
        check(&a);
    }

    #[test]
    fn alloc_full_capacity_bin_and_non_bin_sizes() {
        for capacity in [4096, 64 * GIB, 1000, 4097, 6 * GIB + 12345, 3, 9, 17] {
            let mut a = OffsetAllocator::new(capacity).unwrap();
            assert!(a.can_fit(capacity), "capacity {capacity}");
            let x = a.allocate(capacity).unwrap();
            assert_eq!(a.consumed(&x), Some(capacity));
            assert_eq!(a.largest_free_extent(), 0);
            a.free(&x).unwrap();
            // Fill with small pieces, free all, then the whole region again.
            let piece = (capacity / 7).max(1);
            let mut live = Vec::new();
            while let Ok(h) = a.allocate(piece) {
                live.push(h);
            }
            check(&a);
            for (i, h) in live.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
                a.free(h).unwrap_or_else(|e| panic!("free {i}: {e}"));
            }
            for h in live.iter().skip(1).step_by(2) {
                a.free(h).unwrap();
            }
            check(&a);
            assert_eq!(a.largest_free_extent(), capacity);
            let x = a.allocate(capacity).unwrap();
            assert_eq!(x.offset(), 0);
            a.free(&x).unwrap();
        }
    }

    #[test]
    fn alloc_uniform_sizes_fill_completely() {
        for size in [4 * KIB, 576 * KIB, 2 * MIB, 4608 * KIB, 16 * MIB] {
            let capacity = 1000 * size;
            let mut a = OffsetAllocator::new(capacity).unwrap();
            let mut live = Vec::new();
            while let Ok(h) = a.allocate(size) {
                live.push(h);
            }
            assert_eq!(live.len(), 1000);
            // Churn: free every third, re-allocate; the region must refill completely.
            for h in live.iter().step_by(3) {
                a.free(h).unwrap();
            }
            let mut refilled = 0;
            while a.allocate(size).is_ok() {
                refilled += 1;
            }
            assert_eq!(refilled, live.iter().step_by(3).count());
            assert_eq!(a.used_bytes(), capacity);
            check(&a);
        }
    }

    #[test]
    fn alloc_free_then_same_size_succeeds() {
        let mut a = OffsetAllocator::new(10_000).unwrap();
        let mut live = Vec::new();
        let mut x = 12345u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = 1 + x % 700;
            match a.allocate(size) {
                Ok(h) => live.push(h),
                Err(_) if !live.is_empty() => {
                    let h = live.swap_remove((x as usize / 7) % live.len());
                    a.free(&h).unwrap();
                    let again = a.allocate(h.size()).unwrap();
                    live.push(again);
                }
                Err(e) => panic!("{e}"),
            }
            check(&a);
        }
    }

    #[test]
    fn alloc_largest_free_extent_is_exact() {
        let mut a = OffsetAllocator::new(100_000).unwrap();
        let handles: Vec<_> = (0..10).map(|_| a.allocate(9000).unwrap()).collect();
        // Consumed 9216 each (9000 rounds up to 9 << 10).
        assert_eq!(a.consumed(&handles[0]), Some(9216));
        assert_eq!(a.largest_free_extent(), 100_000 - 10 * 9216);
        a.free(&handles[3]).unwrap();
        a.free(&handles[4]).unwrap();
        assert_eq!(a.largest_free_extent(), 2 * 9216);
        a.free(&handles[9]).unwrap();
        // The tail (7840 + 9216) is still smaller than the freed middle pair.
        assert_eq!(a.largest_free_extent(), 2 * 9216);
        a.free(&handles[8]).unwrap();
        assert_eq!(a.largest_free_extent(), 100_000 - 8 * 9216);
        // Two free extents share the top bin (96 <= size < 104) and the larger is not the list head.
        let alloc = |offset, consumed| SnapshotAllocation { offset, consumed, requested: consumed };
        let snap = AllocatorSnapshot { capacity: 300, allocations: vec![alloc(103, 10), alloc(213, 87)] };
        let (b, _) = OffsetAllocator::restore(&snap).unwrap();
        check(&b);
        assert_eq!(b.extent_size(b.bin_heads[bin_round_down(100) as usize]), 100);
        assert_eq!(b.largest_free_extent(), 103);
    }

    #[test]
    fn alloc_restore_rejects_corrupt_snapshots() {
        let ok = |offset, consumed, requested| SnapshotAllocation { offset, consumed, requested };
        let cases = vec![
            AllocatorSnapshot { capacity: 0, allocations: vec![] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(0, 10, 0)] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(0, 10, 11)] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(20, 10, 10), ok(10, 10, 10)] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(10, 10, 10), ok(10, 10, 10)] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(0, 20, 10), ok(10, 10, 10)] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(95, 10, 10)] },
            AllocatorSnapshot { capacity: u64::MAX, allocations: vec![ok(u64::MAX - 1, 10, 10)] },
            AllocatorSnapshot { capacity: 100, allocations: vec![ok(0, 10, 10), ok(50, 0, 0)] },
        ];
        for (i, case) in cases.iter().enumerate() {
            match OffsetAllocator::restore(case) {
                Err(AllocError::CorruptSnapshot(_)) => {}
                other => panic!("case {i}: expected CorruptSnapshot, got {other:?}"),
            }
        }
    }

    #[test]
    fn alloc_snapshot_restore_round_trip() {
        let mut a = OffsetAllocator::new(64 * GIB + 77).unwrap();
        let mut live = Vec::new();
        for (i, size) in [576 * KIB, 2 * MIB, 4608 * KIB, 16 * MIB, 1, 5000].iter().cycle().take(300).enumerate() {
            let h = a.allocate(*size).unwrap();
            if i % 3 == 1 {
                a.free(&h).unwrap();
            } else {
                live.push(h);
            }
        }
        let snap = a.snapshot();
        assert_eq!(snap.allocations.len(), live.len());
        let (mut b, handles) = OffsetAllocator::restore(&snap).unwrap();
        check(&b);
        assert_eq!(b.nodes.capacity(), b.nodes.len(), "every node sized in at once, none spare");
        assert_eq!(b.snapshot(), snap);
        assert_eq!(b.used_bytes(), a.used_bytes());
        assert_eq!(b.slack_bytes(), a.slack_bytes());
        assert_eq!(b.free_bytes(), a.free_bytes());
        assert_eq!(b.live_allocations(), a.live_allocations());
        assert_eq!(b.largest_free_extent(), a.largest_free_extent());
        for (h, s) in handles.iter().zip(&snap.allocations) {
            assert_eq!((h.offset(), h.size()), (s.offset, s.requested));
            assert_eq!(b.consumed(h), Some(s.consumed));
        }
        // New allocations work on the restored allocator, and restored handles free correctly.
        let extra = b.allocate(2 * MIB).unwrap();
        check(&b);
        for h in &handles {
            b.free(h).unwrap();
            assert_eq!(b.free(h), Err(AllocError::InvalidHandle));
        }
        b.free(&extra).unwrap();
        check(&b);
        assert_eq!(b.largest_free_extent(), b.capacity());
        assert!(b.allocate(b.capacity()).is_ok());

        // A full region and an empty one round-trip as well.
        let full = AllocatorSnapshot {
            capacity: 10,
            allocations: vec![SnapshotAllocation { offset: 0, consumed: 10, requested: 3 }],
        };
        let (c, _) = OffsetAllocator::restore(&full).unwrap();
        check(&c);
        assert_eq!(c.snapshot(), full);
        let empty = AllocatorSnapshot { capacity: 10, allocations: vec![] };
        let (d, h) = OffsetAllocator::restore(&empty).unwrap();
        assert!(h.is_empty());
        assert_eq!(d.largest_free_extent(), 10);
        check(&d);
    }

    #[test]
    fn emptying_compacts_node_storage_and_stale_handles_stay_invalid() {
        let mut a = OffsetAllocator::new(1 << 30).unwrap();
        let handles: Vec<_> = (0..10_000).map(|_| a.allocate(4096).unwrap()).collect();
        assert!(a.nodes.len() > 10_000);
        for h in &handles {
            a.free(h).unwrap();
        }
        assert_eq!(a.nodes.len(), 1, "node storage shrank back");
        assert_eq!(a.allocations_total(), 10_000);
        let fresh: Vec<_> = (0..100).map(|_| a.allocate(4096).unwrap()).collect();
        for h in &handles[..100] {
            assert_eq!(a.free(h), Err(AllocError::InvalidHandle), "a pre-compaction handle never matches");
        }
        for h in &fresh {
            a.free(h).unwrap();
        }
        assert_eq!(a.largest_free_extent(), 1 << 30);
        a.check_invariants().unwrap();
    }
}
