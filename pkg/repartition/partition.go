package repartition

// Partitioning: which partition of a topic holds a key.
//
// Producers key transactions by entity id (the contract: key = entity id as UTF-8 bytes) and
// Kafka's default partitioner places a keyed record on
//
//	partition = (murmur2(key) & 0x7fffffff) mod partitions
//
// (Java's BuiltInPartitioner.partitionForKey / Utils.toPositive(Utils.murmur2(key));
// franz-go's StickyKeyPartitioner with its default hasher, librdkafka's
// murmur2_random). The API finds an entity's partition the same way, so the owner it
// asks is the one whose state holds the entity, and a first stage places each hop
// record on the repartition partition of its group's key the same way, so that a
// re-keyed group's key lives in one second stage, found by the same rule. A producer that partitions
// otherwise (another hash, a custom partitioner) makes the API look in the wrong
// partition: the service counts such records as key mismatches only when the key is
// not the entity id, so this rule is documented in docs/api.md.

// murmur2 is Kafka's Utils.murmur2: 32-bit MurmurHash2 with seed 0x9747b28c.
func murmur2(data []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := n &^ 3
	switch n & 3 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// PartitionFor is the partition Kafka's default partitioner gives a record keyed by
// key on a topic of n partitions (n > 0).
func PartitionFor(key string, n int32) int32 {
	return (murmur2([]byte(key)) & 0x7fffffff) % n
}
