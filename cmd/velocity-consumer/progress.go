package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/term"

	"github.com/velocity-consumer/velocity-consumer/pkg/replay"
)

// startProgress reports a replay's progress until the returned stop is called:
// a one-line bar redrawn on stderr when stderr is a terminal, periodic log
// lines otherwise (a CI log or a file should not fill with carriage returns),
// nothing with --quiet. stop waits for the reporter to finish its last line.
func startProgress(ctx context.Context, prog *replay.Progress, quiet bool, every time.Duration, log *zap.Logger) (stop func()) {
	if quiet {
		return func() {}
	}
	tty := term.IsTerminal(int(os.Stderr.Fd()))
	interval := every
	if tty {
		interval = 200 * time.Millisecond
	}
	if interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s := snapshotProgress(prog, time.Since(start))
				if tty {
					drawBar(os.Stderr, s, termWidth())
				} else {
					s.log(log)
				}
			case <-done:
				if tty {
					drawBar(os.Stderr, snapshotProgress(prog, time.Since(start)), termWidth())
					fmt.Fprintln(os.Stderr)
				}
				return
			case <-ctx.Done():
				if tty {
					fmt.Fprintln(os.Stderr)
				}
				<-done
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func termWidth() int {
	if w, _, err := term.GetSize(int(os.Stderr.Fd())); err == nil && w > 20 {
		return w
	}
	return 80
}

// progressSnapshot is one reading of the counters with the derived rate and ETA.
type progressSnapshot struct {
	records, outputs, done, total int64
	unit                          string
	elapsed                       time.Duration
	rate                          float64       // records per second
	eta                           time.Duration // -1 when unknown
}

func snapshotProgress(p *replay.Progress, elapsed time.Duration) progressSnapshot {
	s := progressSnapshot{
		records: p.Records.Load(), outputs: p.Outputs.Load(),
		done: p.Done.Load(), total: p.Total.Load(), unit: p.Unit,
		elapsed: elapsed, eta: -1,
	}
	if sec := elapsed.Seconds(); sec > 0 {
		s.rate = float64(s.records) / sec
		// The ETA is in units of the range (offsets or bytes), which are known
		// up front, unlike the number of records.
		if s.total > 0 && s.done > 0 {
			left := float64(s.total-s.done) / (float64(s.done) / sec)
			s.eta = time.Duration(left * float64(time.Second)).Round(time.Second)
		}
	}
	return s
}

func (s progressSnapshot) fraction() float64 {
	if s.total <= 0 {
		return 0
	}
	return min(float64(s.done)/float64(s.total), 1)
}

func (s progressSnapshot) log(log *zap.Logger) {
	fields := []zap.Field{
		zap.Int64("records", s.records), zap.Int64("outputs", s.outputs),
		zap.Float64("records_per_second", float64(int64(s.rate))),
	}
	if s.total > 0 {
		fields = append(fields, zap.String("done", fmt.Sprintf("%.1f%%", 100*s.fraction())),
			zap.Int64(s.unit+"_done", s.done), zap.Int64(s.unit+"_total", s.total))
	}
	if s.eta >= 0 {
		fields = append(fields, zap.Duration("eta", s.eta))
	}
	log.Info("replay progress", fields...)
}

// drawBar redraws one line: [#####.....]  42.0%  1234567 records  345678/s  ETA 12s
func drawBar(w io.Writer, s progressSnapshot, width int) {
	text := fmt.Sprintf(" %5.1f%%  %d records  %s/s", 100*s.fraction(), s.records, humanCount(s.rate))
	if s.eta >= 0 {
		text += "  ETA " + s.eta.String()
	}
	barWidth := width - len(text) - 3
	if barWidth < 10 {
		fmt.Fprintf(w, "\r%s\x1b[K", text)
		return
	}
	filled := int(s.fraction() * float64(barWidth))
	fmt.Fprintf(w, "\r[%s%s]%s\x1b[K", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), text)
}

func humanCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
