//go:build !race

package storm

// raceEnabled: this test binary has the race detector, and so do the
// scheduler binaries it builds.
const raceEnabled = false
