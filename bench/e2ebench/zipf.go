package e2ebench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// zipf draws ranks 0..n-1 with P(rank k) = (k+1)^-theta / ζ(n, theta),
// the Zipf law of YCSB and fio's zipf:0.99 (math/rand's Zipf needs an
// exponent above 1). It inverts the exact cumulative distribution by binary
// search over a table of n float64s (16 MiB for an 8 GiB namespace of 4 KiB
// pages), so the shares are exact rather than the closed-form approximation
// some generators use, which overweights the ranks just below the top two.
type zipf struct {
	cdf  []float64 // cdf[k] = P(rank ≤ k); the last is 1
	perm permutation
}

// newZipf prepares a generator over n items; ranks are scattered over
// 0..n-1 by a fixed permutation so that the hot pages are not adjacent.
func newZipf(n int64, theta float64) (*zipf, error) {
	if n < 2 || theta <= 0 || theta >= 1 {
		return nil, fmt.Errorf("zipf: need n ≥ 2 and 0 < theta < 1, got n %d theta %g", n, theta)
	}
	z := &zipf{cdf: make([]float64, n), perm: newPermutation(n)}
	var sum float64
	for k := range n {
		sum += math.Pow(float64(k+1), -theta)
		z.cdf[k] = sum
	}
	for k := range z.cdf {
		z.cdf[k] /= sum
	}
	z.cdf[n-1] = 1
	return z, nil
}

// rank draws a rank (0 = hottest).
func (z *zipf) rank(r *rand.Rand) int64 {
	k, _ := slices.BinarySearch(z.cdf, r.Float64())
	return int64(min(k, len(z.cdf)-1))
}

// page draws a page index.
func (z *zipf) page(r *rand.Rand) int64 { return z.perm.at(z.rank(r)) }

// share is the probability of rank k.
func (z *zipf) share(k int64) float64 {
	if k == 0 {
		return z.cdf[0]
	}
	return z.cdf[k] - z.cdf[k-1]
}

// permutation is the bijection k -> (k*mul + add) mod n with mul coprime
// to n.
type permutation struct{ n, mul, add int64 }

func newPermutation(n int64) permutation {
	mul := int64(2654435761) % n
	for mul < 2 || gcd(mul, n) != 1 {
		mul = (mul + 1) % n
		if n <= 2 {
			mul = 1
			break
		}
	}
	return permutation{n: n, mul: mul, add: n / 3}
}

func (p permutation) at(k int64) int64 {
	// k*mul fits in int64 while both are below 2^31 pages (8 TiB);
	// mulmod handles larger namespaces.
	return (mulmod(k, p.mul, p.n) + p.add) % p.n
}

func mulmod(a, b, m int64) int64 {
	if a < 1<<31 && b < 1<<31 {
		return a * b % m
	}
	var r int64
	a %= m
	for b > 0 {
		if b&1 == 1 {
			r = (r + a) % m
		}
		a = (a * 2) % m
		b >>= 1
	}
	return r
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
