// Package kfaketest injects the broker answers that unit tests on an
// in-process kfake cluster need and kfake does not give on its own. It is for
// tests only.
package kfaketest

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// RefuseProduces answers the cluster's next n Produce requests with
// UNKNOWN_TOPIC_OR_PARTITION for every partition in them, as a broker answers
// for a just-created partition it has not taken on yet ("This server does not
// host this topic-partition"), and lets later ones through. It returns the
// count of requests refused so far.
func RefuseProduces(c *kfake.Cluster, n int32) *atomic.Int32 {
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if refused.Load() >= n {
			return nil, nil, false // not kept: the control is dropped
		}
		c.KeepControl()
		refused.Add(1)
		pr := req.(*kmsg.ProduceRequest)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.UnknownTopicOrPartition.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return &refused
}

// RefuseOffsetCommits answers, with code for every partition in it, each
// OffsetCommit request for which refuse says so, and lets the others through.
func RefuseOffsetCommits(c *kfake.Cluster, code int16, refuse func(*kmsg.OffsetCommitRequest) bool) {
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		creq := req.(*kmsg.OffsetCommitRequest)
		if !refuse(creq) {
			return nil, nil, false
		}
		resp := creq.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range creq.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// FailListOffsets answers the cluster's next n ListOffsets requests with err
// for every partition in them, as a broker answers while a partition's leader
// restarts or moves (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE), and lets
// later ones through. It returns the count of requests failed so far.
func FailListOffsets(c *kfake.Cluster, n int32, err *kerr.Error) *atomic.Int32 {
	var failed atomic.Int32
	c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if failed.Load() >= n {
			return nil, nil, false
		}
		c.KeepControl()
		failed.Add(1)
		return AnswerListOffsets(req.(*kmsg.ListOffsetsRequest), func(sp *kmsg.ListOffsetsResponseTopicPartition) {
			sp.ErrorCode = err.Code
		}), nil, true
	})
	return &failed
}

// AnswerListOffsets is a broker's answer to lr made up by the test: a partition
// entry for every partition asked, each filled in by set (its partition number
// is set already).
func AnswerListOffsets(lr *kmsg.ListOffsetsRequest, set func(*kmsg.ListOffsetsResponseTopicPartition)) *kmsg.ListOffsetsResponse {
	resp := lr.ResponseKind().(*kmsg.ListOffsetsResponse)
	for _, rt := range lr.Topics {
		st := kmsg.NewListOffsetsResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewListOffsetsResponseTopicPartition()
			sp.Partition = rp.Partition
			set(&sp)
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
