package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// OutputTopic names a topic the sink will write to and the flag that chose it,
// for error messages.
type OutputTopic struct {
	Flag, Name string
	// Exact requires an existing topic to have exactly the given partition count:
	// a repartition topic, whose partitions are the second stages' (one per input
	// partition), where a different count would move keys between them.
	Exact bool
	// Configs are the topic configs a topic created here gets (an existing
	// topic's are left as they are).
	Configs map[string]*string
}

// RepartitionConfigs are a repartition topic's configs: its records carry the
// broker's append time, the clock a second stage measures idle leases on
// (docs/repartition.md), so that the instances' own clocks do not enter it.
func RepartitionConfigs() map[string]*string {
	lat := "LogAppendTime"
	return map[string]*string{"message.timestamp.type": &lat}
}

// EnsureTopics creates each of topics that does not exist yet, with the given
// partition count and the broker's default replication factor, and returns the
// names it created. Creating them up front turns a missing topic into one clear
// error at start (naming the flag, and the permission to grant) instead of
// every produce retrying until its delivery timeout.
func EnsureTopics(ctx context.Context, adm *kadm.Client, partitions int32, topics ...OutputTopic) (created []string, err error) {
	for _, t := range topics {
		if t.Name == "" {
			continue
		}
		// One topic per request: kadm turns a topic's TOPIC_AUTHORIZATION_FAILED
		// into the request's error, which would not say which topic it was.
		md, err := adm.Metadata(ctx, t.Name)
		if errors.Is(err, kerr.TopicAuthorizationFailed) {
			return created, notAuthorized(t, err)
		}
		if err != nil {
			return created, fmt.Errorf("read topic metadata of %s %q: %w", t.Flag, t.Name, err)
		}
		td, ok := md.Topics[t.Name]
		if ok && errors.Is(td.Err, kerr.TopicAuthorizationFailed) {
			return created, notAuthorized(t, td.Err)
		}
		if ok && td.Err == nil {
			if t.Exact && int32(len(td.Partitions)) != partitions {
				return created, fmt.Errorf("%s %q has %d partitions and the input topic %d: a repartition topic must have the input's count; delete it (its consumer group's re-keyed state goes with it) or use a new consumer group",
					t.Flag, t.Name, len(td.Partitions), partitions)
			}
			continue
		}
		resp, err := adm.CreateTopic(ctx, max(partitions, 1), -1, t.Configs, t.Name)
		if err == nil {
			err = resp.Err
		}
		if errors.Is(err, kerr.TopicAlreadyExists) {
			continue // created by another instance meanwhile
		}
		if err != nil {
			return created, fmt.Errorf("%s %q does not exist and could not be created (%w): create it, or grant this principal Create on it", t.Flag, t.Name, err)
		}
		created = append(created, t.Name)
	}
	return created, nil
}

// notAuthorized is the error for an output topic the principal may not even
// describe. Kafka answers so whether or not the topic exists (it hides topics
// from principals without Describe), so the message names both grants.
func notAuthorized(t OutputTopic, err error) error {
	return fmt.Errorf("not authorized for %s %q (%w): grant this principal Write on it (Write includes Describe), and Create as well if it does not exist yet", t.Flag, t.Name, err)
}
