//go:build !race

package definition

const raceEnabled = false
