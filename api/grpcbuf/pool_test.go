package grpcbuf

import (
	"testing"
)

// TestPoolSizes checks the size classes: a buffer from the pool holds what was asked for, and one put
// back lands in a class its capacity covers.
func TestPoolSizes(t *testing.T) {
	var p Pool
	for _, n := range []int{0, 1, 4095, 4096, 4097, 16 << 10, 1 << 20, 1<<20 + 1, 1 << MaxShift, 1<<MaxShift + 1} {
		b := p.GetCap(n)
		if len(*b) != 0 || cap(*b) < n {
			t.Fatalf("GetCap(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		if g := p.Get(n); len(*g) != n || cap(*g) < n {
			t.Fatalf("Get(%d): len %d cap %d", n, len(*g), cap(*g))
		}
		p.Put(b)
	}
	// A buffer whose capacity is not a class size (append grew it) is filed under the largest class it
	// covers, so every class hands out only buffers at least its size.
	for _, c := range []int{100, 6000, 20000, 40000, 3 << 20, 70 << 20} {
		odd := make([]byte, 10, c)
		p.Put(&odd)
	}
	for class := range p.classes {
		for v := p.classes[class].Get(); v != nil; v = p.classes[class].Get() {
			if b := v.(*[]byte); len(*b) != 0 || cap(*b) < 1<<class {
				t.Fatalf("class %d (%d bytes) holds a buffer of len %d cap %d", class, 1<<class, len(*b), cap(*b))
			}
		}
	}
	// And what Get returns for a class's full size fits, whatever was put back.
	for _, c := range []int{6000, 20000, 40000, 3 << 20} {
		odd := make([]byte, 0, c)
		p.Put(&odd)
	}
	for _, n := range []int{8 << 10, 32 << 10, 64 << 10, 4 << 20} {
		if b := p.Get(n); len(*b) != n || cap(*b) < n {
			t.Fatalf("Get(%d) returned len %d cap %d", n, len(*b), cap(*b))
		}
	}
}

// TestBuffersAreReusedUncleared: a buffer given back is handed out again as it was, not cleared,
// which is the pool's point. sync.Pool may drop any single item (it does so on purpose under the race
// detector), so the test asks many times and needs the bytes back once.
func TestBuffersAreReusedUncleared(t *testing.T) {
	var p Pool
	for range 200 {
		b := p.Get(16 << 10)
		(*b)[0], (*b)[len(*b)-1] = 0xAB, 0xCD
		p.Put(b)
		c := p.Get(16 << 10)
		if c == b && (*c)[0] == 0xAB && (*c)[len(*c)-1] == 0xCD {
			return
		}
		p.Put(c)
	}
	t.Fatal("no buffer was handed out again with its bytes in 200 tries")
}
