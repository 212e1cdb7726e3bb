package demo

import (
	"hash/fnv"
	"math/rand/v2"
	"time"

	"carehub/kernel/ids"
)

// seed is the fixed PCG seed of every random stream in the demo data. Changing it changes every
// id and value, and the exported patient ids with them.
const seed uint64 = 0x6361726568756221 // "carehub!"

// stream returns a random source for one named part of the data set. Each part (an asset's
// scores, a patient's vitals) draws from its own stream, so adding or reordering one part leaves
// the others' values and ids unchanged.
func stream(key string) *rand.Rand {
	return rand.New(rand.NewPCG(seed, hash(key)))
}

// idAt makes the id of the entity named by key, with the ULID time part at t.
func idAt(prefix string, t time.Time, key string) string {
	return ids.At(prefix, t, pcgReader{rand.NewPCG(seed, hash(prefix+key))})
}

func hash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// pcgReader adapts a PCG to io.Reader for ULID entropy.
type pcgReader struct{ src *rand.PCG }

func (r pcgReader) Read(p []byte) (int, error) {
	for i := 0; i < len(p); i += 8 {
		v := r.src.Uint64()
		for j := 0; j < 8 && i+j < len(p); j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
	return len(p), nil
}

// between returns a uniform integer in [lo, hi].
func between(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// pick returns a uniform element of xs.
func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }
