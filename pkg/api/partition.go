package api

import "github.com/velocity-consumer/velocity-consumer/pkg/repartition"

// PartitionOf is the input partition that holds entity on a topic of n partitions
// (n > 0): where Kafka's default partitioner puts a record keyed by it
// (repartition.PartitionFor). A producer that partitions otherwise makes the API
// look in the wrong partition; docs/api.md states the rule.
func PartitionOf(entity string, n int32) int32 { return repartition.PartitionFor(entity, n) }
