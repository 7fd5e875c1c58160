// Package retry decides which errors from a Kafka broker may pass with time,
// and retries an operation through them within its context's bound. The
// service's transaction requests and takeovers, and the kafka snapshot
// store's reads, use it: franz-go retries most requests itself, but not the
// ones a caller issues directly, and deliberately never a refused dial.
package retry

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Transient reports whether err may pass with time: what franz-go retries
// itself, a refused dial, which franz-go leaves to its callers, and a
// connection closed on its first read, which franz-go takes for missing SASL
// (a broker restarting does that too; a real SASL mistake fails the client
// long before). An authorization failure never passes, however it is wrapped:
// franz-go wraps a failed producer-id load (a missing ACL included) as an
// error it would retry, and retrying a missing ACL only hides it.
func Transient(err error) bool {
	if NotAuthorized(err) {
		return false
	}
	var op *net.OpError
	return kgo.IsRetryableBrokerErr(err) || kerr.IsRetriable(err) || errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// NotAuthorized reports whether err is, or wraps, a refusal by the authorizer.
func NotAuthorized(err error) bool {
	for _, e := range []error{kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed, kerr.ClusterAuthorizationFailed,
		kerr.TransactionalIDAuthorizationFailed, kerr.DelegationTokenAuthorizationFailed, kerr.SaslAuthenticationFailed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Do runs op until it succeeds, fails for a reason mayPass rejects, or ctx
// ends, waiting 100 ms after the first failure and doubling to max. It
// returns op's last error.
func Do(ctx context.Context, max time.Duration, mayPass func(error) bool, op func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := op()
		if err == nil || !mayPass(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, max)
	}
}
