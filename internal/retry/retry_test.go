package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestTransient(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, dialErr := net.Dial("tcp", addr) // refused: nothing listens there now
	if dialErr == nil {
		t.Fatal("dialled a closed port")
	}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused dial, as franz-go wraps it", fmt.Errorf("unable to dial: %w", dialErr), true},
		{"coordinator loading", kerr.CoordinatorLoadInProgress, true},
		{"not the coordinator", kerr.NotCoordinator, true},
		{"aborted", kerr.TransactionAbortable, false},
		{"leader moving", fmt.Errorf("list offsets: %w", kerr.NotLeaderForPartition), true},
		{"connection closed", fmt.Errorf("read: %w", io.EOF), true},
		{"fenced", kerr.ProducerFenced, false},
		{"not authorized", kerr.TransactionalIDAuthorizationFailed, false},
		{"topic not authorized, wrapped", fmt.Errorf("shard: %w", kerr.TopicAuthorizationFailed), false},
		{"not authorized beside a retriable error", errors.Join(kerr.NotLeaderForPartition, kerr.GroupAuthorizationFailed), false},
		{"anything else", errors.New("disk full"), false},
	} {
		if got := Transient(tt.err); got != tt.want {
			t.Errorf("%s (%v): transient %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestDo(t *testing.T) {
	ctx := context.Background()
	calls := 0
	err := Do(ctx, time.Millisecond, Transient, func() error {
		if calls++; calls < 3 {
			return kerr.CoordinatorLoadInProgress
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Do through two transient failures: %v after %d calls, want nil after 3", err, calls)
	}
	calls = 0
	err = Do(ctx, time.Millisecond, Transient, func() error { calls++; return kerr.ProducerFenced })
	if !errors.Is(err, kerr.ProducerFenced) || calls != 1 {
		t.Fatalf("Do of a lasting failure: %v after %d calls, want it at once", err, calls)
	}
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = Do(ctx, 50*time.Millisecond, Transient, func() error { return kerr.CoordinatorLoadInProgress })
	if !errors.Is(err, kerr.CoordinatorLoadInProgress) || ctx.Err() == nil {
		t.Fatalf("Do past its context: %v (context %v), want the last error once the context ended", err, ctx.Err())
	}
}
