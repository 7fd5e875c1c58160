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
}

// EnsureTopics creates each of topics that does not exist yet, with the given
// partition count and the broker's default replication factor, and returns the
// names it created. Creating them up front turns a missing topic into one clear
// error at start (naming the flag, and the permission to grant) instead of
// every produce retrying until its delivery timeout.
func EnsureTopics(ctx context.Context, adm *kadm.Client, partitions int32, topics ...OutputTopic) (created []string, err error) {
	names := make([]string, 0, len(topics))
	for _, t := range topics {
		if t.Name != "" {
			names = append(names, t.Name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	md, err := adm.Metadata(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("read topic metadata: %w", err)
	}
	for _, t := range topics {
		if t.Name == "" {
			continue
		}
		if td, ok := md.Topics[t.Name]; ok && td.Err == nil {
			continue
		}
		resp, err := adm.CreateTopic(ctx, max(partitions, 1), -1, nil, t.Name)
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
