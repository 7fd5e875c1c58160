//go:build race

package definition

// raceEnabled shrinks the random differential runs under -race, which is ten
// times slower and checks concurrency, not coverage.
const raceEnabled = true
