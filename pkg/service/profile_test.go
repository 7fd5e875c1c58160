package service

import "testing"

// TestProfileStage: the profiler label that splits a profile of `run` by stage names an
// input's service "input" and a re-keyed group's second stage by its group.
func TestProfileStage(t *testing.T) {
	cases := []struct {
		name  string
		merge *MergeGroup
		want  string
	}{
		{"first stage", nil, "input"},
		{"second stage", &MergeGroup{Name: "device"}, "group:device"},
		{"second stage, another group", &MergeGroup{Name: "ip"}, "group:ip"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Service{cfg: Config{Merge: c.merge}}
			if got := s.ProfileStage(); got != c.want {
				t.Fatalf("ProfileStage() = %q, want %q", got, c.want)
			}
		})
	}
}
