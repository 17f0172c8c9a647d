package window

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestWindowSlides(t *testing.T) {
	w := New(10 * time.Second) // ten buckets of a second
	at := func(s float64) int64 { return int64(time.Hour) + int64(s*float64(time.Second)) }
	w.At(at(0)).Total += 3
	w.At(at(0.5)).Marked++
	w.At(at(5)).Total += 2
	assert.Equal(t, Counts{Total: 5, Marked: 1}, w.Sum(at(9.9)), "all inside")
	assert.Equal(t, Counts{Total: 2}, w.Sum(at(10)), "the first second slid out")
	assert.Equal(t, Counts{}, w.Sum(at(15)), "all slid out")
	// A bucket reused a round later starts from zero.
	w.At(at(20)).Total++
	assert.Equal(t, Counts{Total: 1}, w.Sum(at(20)))
	assert.Equal(t, int64(time.Second), w.Step())
}
