package window

import (
	"slices"
	"strings"
	"testing"
)

func TestParseSpecs(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Spec
		wantErr string // substring; "" = success
	}{
		{name: "default set in order", in: DefaultSpecs, want: []Spec{
			{"1m", 60000, 1000, 60}, {"5m", 300000, 5000, 60}, {"1h", 3600000, 60000, 60}, {"24h", 86400000, 3600000, 24},
		}},
		{name: "spaces, days and odd names", in: " 1d:1h , 90s:45s,1500ms:500ms", want: []Spec{
			{"24h", 86400000, 3600000, 24}, {"90s", 90000, 45000, 2}, {"1500ms", 1500, 500, 3},
		}},
		{name: "compound go duration", in: "1h30m:30m", want: []Spec{{"90m", 5400000, 1800000, 3}}},
		{name: "single bucket window", in: "3s:3s", want: []Spec{{"3s", 3000, 3000, 1}}},
		{name: "exactly the bucket limit", in: "100s:1ms", want: []Spec{{"100s", 100000, 1, 100000}}},
		{name: "empty", in: " ", wantErr: "empty list"},
		{name: "missing colon", in: "5m", wantErr: "want W:b"},
		{name: "zero bucket", in: "5m:0s", wantErr: "bucket width 0ms must be positive"},
		{name: "negative window", in: "-5m:5s", wantErr: "window length -300000ms must be positive"},
		{name: "zero window", in: "0s:1s", wantErr: "must be positive"},
		{name: "not a multiple", in: "5m:7s", wantErr: "not a multiple of bucket width 7s"},
		{name: "bucket wider than window", in: "1s:2s", wantErr: "not a multiple"},
		{name: "too many buckets", in: "24h:100ms", wantErr: "864000 buckets, more than the limit of 100000"},
		{name: "just over the bucket limit", in: "100001ms:1ms", wantErr: "100001 buckets"},
		{name: "duplicate window", in: "5m:5s,1m:1s,5m:1m", wantErr: "already configured"},
		{name: "duplicate spelled differently", in: "1d:1h,24h:1h", wantErr: "already configured"},
		{name: "sub-millisecond", in: "1s:500us", wantErr: "whole number of milliseconds"},
		{name: "garbage duration", in: "5x:1s", wantErr: "want a duration"},
		{name: "garbage days", in: "1.5d:1h", wantErr: "whole days"},
		{name: "trailing comma", in: "5m:5s,", wantErr: "want W:b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSpecs(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseSpecs(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSpecs(%q): %v", tc.in, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("ParseSpecs(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			again, err := ParseSpecs(FormatSpecs(got))
			if err != nil || !slices.Equal(again, got) {
				t.Fatalf("round trip via %q = %+v, %v", FormatSpecs(got), again, err)
			}
		})
	}
}

func TestFormatSpecsCanonical(t *testing.T) {
	specs, err := ParseSpecs("60s:1000ms,300000ms:5s,60m:1m,1d:60m")
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatSpecs(specs); got != DefaultSpecs {
		t.Fatalf("FormatSpecs = %q, want %q", got, DefaultSpecs)
	}
}

func TestNewTableRejectsInconsistentSpecs(t *testing.T) {
	for _, specs := range [][]Spec{
		nil,
		{{Name: "1m", WindowMs: 60000, BucketMs: 1000, Buckets: 59}},
		{{Name: "5m", WindowMs: 60000, BucketMs: 1000, Buckets: 60}},
		{{Name: "1m", WindowMs: 60000, BucketMs: 7000, Buckets: 8}},
		{{"1m", 60000, 1000, 60}, {"1m", 60000, 2000, 30}},
	} {
		if _, err := NewTable(specs, Options{}); err == nil {
			t.Errorf("NewTable(%+v) succeeded, want error", specs)
		}
	}
	specs, _ := ParseSpecs(DefaultSpecs)
	if _, err := NewTable(specs, Options{MaxEntities: -1}); err == nil {
		t.Error("negative MaxEntities accepted")
	}
	if _, err := NewTable(specs, Options{HistoryTTLMs: -1}); err == nil {
		t.Error("negative HistoryTTLMs accepted")
	}
}
