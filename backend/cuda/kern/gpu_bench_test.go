package kern_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
	"github.com/cortiq/cortiq/backend/cuda/kern"
	"github.com/cortiq/cortiq/quant"
)

// BenchmarkGPUMatvec times the matvec kernels on an 8B-shaped up
// projection (14336×4096) with CUDA events, 20 launches per sample;
// SetBytes is the weight bytes, so MB/s is the weight stream's bandwidth
// (compare with the H200's measured 4547 GB/s read).
func BenchmarkGPUMatvec(b *testing.B) {
	d, m := benchGPU(b)
	const launches = 20
	// The 8B shapes: up/gate, down, k/v projections.
	for _, sh := range [][2]int{{14336, 4096}, {4096, 14336}, {1024, 4096}, {28672, 4096}, {128256, 4096}} {
		rows, cols := sh[0], sh[1]
		for _, dt := range []quant.DType{quant.F16, quant.BF16, quant.Q8Row, quant.Q4TP} {
			nb, _ := quant.ExpectedBytes(dt, []int{rows, cols})
			for _, R := range []int{1, 2, 4, 8} {
				b.Run(fmt.Sprintf("%dx%d/%s/R%d", rows, cols, dt, R), func(b *testing.B) {
					var w, x, y driver.DevicePtr
					var a driver.Args
					name, cfg, err := kern.MatvecLaunch(dt, rows, cols, R, d.Info().SMs)
					if err != nil {
						b.Fatal(err)
					}
					err = d.Do(func(c *driver.Ctx) error {
						var err error
						if cfg.Shared > 48<<10 {
							f, _ := m.Func(name)
							if err := c.SetMaxDynamicShared(f, cfg.Shared); err != nil {
								return err
							}
						}
						if w, err = c.Alloc(nb); err != nil {
							return err
						}
						c.MemsetD8(w, 0x11, nb) // finite weights in every format
						x, _ = c.Alloc(4 * int64(R*cols))
						y, _ = c.Alloc(4 * int64(R*rows))
						c.MemsetD32(x, 0x3c000000, int64(R*cols))
						if dt == quant.Q8Row || dt == quant.Q4TP {
							kern.MQ{W: [3]driver.DevicePtr{w}, Rows: [3]int{rows}, Cols: cols, X: x, Ldx: cols, Y: y, Ldy: rows}.Pack(&a, 0)
						} else {
							a.Ptr(w).Int(rows).Int(cols).Ptr(x).Int(cols).Ptr(y).Int(rows).Ptr(0).Int(0)
						}
						return m.Launch(c, name, cfg, &a) // warm-up
					})
					defer d.Do(func(c *driver.Ctx) error {
						c.Free(w)
						c.Free(x)
						return c.Free(y)
					})
					if err != nil {
						b.Fatal(err)
					}
					ms := timeLaunches(b, d, launches, func(c *driver.Ctx) error { return m.Launch(c, name, cfg, &a) })
					b.SetBytes(nb * launches)
					sec := float64(ms) / 1e3
					b.ReportMetric(float64(nb)*launches*float64(b.N)/sec/1e9, "GB/s")
					b.ReportMetric(sec/float64(b.N*launches)*1e6, "µs/launch")
				})
			}
		}
	}
}

// BenchmarkGPUGemm times the prefill GEMM on the 8B shapes (up/gate
// 14336×4096, o 4096×4096) at T = 512 with CUDA events, 10 launches per
// sample, both tiles (t128: gemm_<fmt>, t64: gemm_<fmt>_t64; kern.GemmKernel
// picks one by block count). TFLOP/s counts 2·rows·cols·T per launch; the
// bar of issue 9 (pp512 ≥ 5,000 tok/s on the 8B q4tp model) needs about
// 80 or more.
func BenchmarkGPUGemm(b *testing.B) {
	d, m := benchGPU(b)
	const T, launches = 512, 10
	for _, dt := range []quant.DType{quant.Q4TP, quant.Q8Row} {
		for _, sh := range [][2]int{{14336, 4096}, {4096, 4096}} {
			rows, cols := sh[0], sh[1]
			nb, _ := quant.ExpectedBytes(dt, []int{rows, cols})
			for _, bm := range []int{128, 64} {
				name := "gemm_" + kernName[dt]
				if bm == 64 {
					name += "_t64"
				}
				pick, _, _ := kern.GemmKernel(kernName[dt], rows, T)
				b.Run(fmt.Sprintf("%s/%dx%d/T%d/t%d", dt, rows, cols, T, bm), func(b *testing.B) {
					var w, x, y driver.DevicePtr
					var a driver.Args
					cfg := driver.Config{Grid: driver.D2((rows+127)/128, (T+bm-1)/bm), Block: driver.D1(256)}
					err := d.Do(func(c *driver.Ctx) error {
						var err error
						if w, err = c.Alloc(nb); err != nil {
							return err
						}
						c.MemsetD8(w, 0x11, nb) // finite weights in every format
						x, _ = c.Alloc(4 * int64(T*cols))
						y, _ = c.Alloc(4 * int64(T*rows))
						c.MemsetD32(x, 0x3c000000, int64(T*cols))
						a.Ptr(w).Int(rows).Int(cols).Ptr(x).Int(cols).Ptr(y).Int(rows).Int(T).Ptr(0).Int(0)
						return m.Launch(c, name, cfg, &a) // warm-up
					})
					defer d.Do(func(c *driver.Ctx) error {
						c.Free(w)
						c.Free(x)
						return c.Free(y)
					})
					if err != nil {
						b.Fatal(err)
					}
					ms := timeLaunches(b, d, launches, func(c *driver.Ctx) error { return m.Launch(c, name, cfg, &a) })
					flops := 2 * float64(rows) * float64(cols) * T
					sec := float64(ms) / 1e3
					b.SetBytes(nb * launches)
					b.ReportMetric(flops*launches*float64(b.N)/sec/1e12, "TFLOP/s")
					b.ReportMetric(sec/float64(b.N*launches)*1e6, "µs/launch")
					if pick == name {
						b.ReportMetric(1, "picked")
					} else {
						b.ReportMetric(0, "picked")
					}
				})
			}
		}
	}
}

// benchGPU opens GPU 0 with the kernels loaded for a benchmark, or skips
// without one; the device is closed when the benchmark ends.
func benchGPU(b *testing.B) (*driver.Device, *kern.Module) {
	b.Helper()
	d, err := driver.Open(0)
	if errors.Is(err, driver.ErrNoDevice) {
		b.Skipf("no GPU: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	var m *kern.Module
	if err := d.Do(func(c *driver.Ctx) error {
		var err error
		m, err = loadForTest(c, d)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return d, m
}

// timeLaunches runs queue launches times between two CUDA events in every
// b.Loop iteration and returns the milliseconds the events measured in
// all.
func timeLaunches(b *testing.B, d *driver.Device, launches int, queue func(c *driver.Ctx) error) float32 {
	b.Helper()
	var e0, e1 driver.Event
	if err := d.Do(func(c *driver.Ctx) error {
		var err error
		if e0, err = c.NewEvent(0); err != nil {
			return err
		}
		e1, err = c.NewEvent(0)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer d.Do(func(c *driver.Ctx) error {
		c.DestroyEvent(e0)
		return c.DestroyEvent(e1)
	})
	var ms float32
	for b.Loop() {
		err := d.Do(func(c *driver.Ctx) error {
			c.Record(e0, 0)
			for range launches {
				if err := queue(c); err != nil {
					return err
				}
			}
			c.Record(e1, 0)
			if err := c.EventSync(e1); err != nil {
				return err
			}
			t, err := c.Elapsed(e0, e1)
			ms += t
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return ms
}

// BenchmarkGPUDeltaNet times one Gated DeltaNet layer's kernels (dn_conv,
// dn_conv_state, dn_rule) at Qwen3-Next-80B's shape (16 key heads, 32
// value heads of 128×128, conv 4, grouped projections) with CUDA events,
// 10 steps per sample: decode steps of 1, 8 and 64 sequences (one row
// each), prefill chunks of 512, 64, 16 and 8 rows of one sequence with dn_rule
// and with the chunked rule (_chunked: dn_chunk_prep, dn_chunk_state,
// dn_gnorm in place of dn_rule). SetBytes is the
// recurrent state read and written (the decode steps' floor); µs/step and
// tok/s are the three kernels' time.
func BenchmarkGPUDeltaNet(b *testing.B) {
	d, m := benchGPU(b)
	const steps = 10
	k := kern.DeltaNet{KeyHeads: 16, ValueHeads: 32, KeyDim: 128, ValueDim: 128, ConvKernel: 4, Grouped: true, Eps: 1e-6}
	_, vd, cd := k.Dims()
	pw, stride := k.ProjWidth(), k.StateFloats()
	k.Ldp, k.Ldc, k.Ldo = pw, cd, vd
	for _, sh := range []struct {
		rows, seqs int
		chunk      bool
	}{{1, 1, false}, {8, 8, false}, {64, 64, false}, {512, 1, false}, {512, 1, true}, {64, 1, false}, {64, 1, true}, {16, 1, false}, {16, 1, true}, {8, 1, false}, {8, 1, true}} {
		R, seqs := sh.rows, sh.seqs
		name := fmt.Sprintf("rows%d_seqs%d", R, seqs)
		if sh.chunk {
			name += "_chunked"
		}
		b.Run(name, func(b *testing.B) {
			slots := make([]byte, 4*R)
			for r := range R {
				binary.LittleEndian.PutUint32(slots[4*r:], uint32(r*seqs/R)) // each sequence's rows consecutive
			}
			var bufs []driver.DevicePtr
			var calls []struct {
				name string
				cfg  driver.Config
				a    driver.Args
			}
			err := d.Do(func(c *driver.Ctx) error {
				alloc := func(n int64) driver.DevicePtr {
					p, err := c.Alloc(n)
					if err != nil {
						return 0
					}
					bufs = append(bufs, p)
					c.MemsetD32(p, 0x3c000000, n/4) // 1/128: finite inputs and state
					return p
				}
				k.Proj, k.ConvW, k.State = alloc(4*int64(R*pw)), alloc(4*int64(cd*k.ConvKernel)), alloc(4*int64(seqs)*int64(stride))
				k.Slot, k.Conv, k.Out = alloc(int64(4*R)), alloc(4*int64(R*cd)), alloc(4*int64(R*vd))
				k.ALog, k.Dt, k.NormW = alloc(4*int64(k.ValueHeads)), alloc(4*int64(k.ValueHeads)), alloc(4*int64(k.ValueDim))
				for _, p := range bufs {
					if p == 0 {
						return fmt.Errorf("allocation failed")
					}
				}
				if err := c.HtoD(k.Slot, slots); err != nil {
					return err
				}
				cc, rc := k.ConvLaunch(R), k.RuleLaunch(seqs)
				f, err := m.Func("dn_rule")
				if err != nil {
					return err
				}
				if err := c.SetMaxDynamicShared(f, rc.Shared); err != nil {
					return err
				}
				calls = make([]struct {
					name string
					cfg  driver.Config
					a    driver.Args
				}, 3)
				calls[0].name, calls[0].cfg = "dn_conv", cc
				calls[1].name, calls[1].cfg = "dn_conv_state", cc
				calls[2].name, calls[2].cfg = "dn_rule", rc
				k.PackConv(&calls[0].a)
				k.PackConvState(&calls[1].a)
				k.PackRule(&calls[2].a, R)
				if sh.chunk {
					// The chunked rule in place of dn_rule.
					X := alloc(k.ChunkScratch(R))
					if X == 0 {
						return fmt.Errorf("allocation failed")
					}
					calls = calls[:2]
					p, sc, nc := k.ChunkLaunches(R, seqs)
					for _, ch := range []struct {
						name string
						cfg  driver.Config
					}{{"dn_chunk_prep", p}, {"dn_chunk_state", sc}, {"dn_gnorm", nc}} {
						f, err := m.Func(ch.name)
						if err != nil {
							return err
						}
						if ch.cfg.Shared > 0 {
							if err := c.SetMaxDynamicShared(f, ch.cfg.Shared); err != nil {
								return err
							}
						}
						calls = append(calls, struct {
							name string
							cfg  driver.Config
							a    driver.Args
						}{name: ch.name, cfg: ch.cfg})
						k.PackChunk(&calls[len(calls)-1].a, R, X)
					}
				}
				return c.Synchronize()
			})
			defer d.Do(func(c *driver.Ctx) error {
				for _, p := range bufs {
					c.Free(p)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			ms := timeLaunches(b, d, steps, func(c *driver.Ctx) error {
				for i := range calls {
					if err := m.Launch(c, calls[i].name, calls[i].cfg, &calls[i].a); err != nil {
						return err
					}
				}
				return nil
			})
			state := int64(seqs) * int64(k.ValueHeads*k.KeyDim*k.ValueDim) * 4 * 2
			b.SetBytes(state * steps)
			sec := float64(ms) / 1e3
			per := sec / float64(b.N*steps)
			b.ReportMetric(per*1e6, "µs/step")
			b.ReportMetric(float64(R)/per, "tok/s")
			b.ReportMetric(float64(state)/per/1e9, "state_GB/s")
		})
	}
}

// BenchmarkGPUAttention times decode attention at the 8B shape (32 query
// heads, 8 kv heads of 128) with CUDA events, 20 launches per sample, for
// R rows (each its own sequence, all at length len): attn_split +
// attn_merge at the split count the device used before attn_tiles
// (2·SMs/(nkv·R)), and attn_tiles at 1, 2 and 4 splits and at
// kern.AttnTilesSplits, then attn_tiles_h over float16 caches. SetBytes
// is the K and V bytes the rows read, so GB/s compares with the device's
// read bandwidth.
func BenchmarkGPUAttention(b *testing.B) {
	d, m := benchGPU(b)
	const launches, nq, nkv, hd = 20, 32, 8, 128
	sms := d.Info().SMs
	for _, sh := range []struct{ R, n int }{{1, 192}, {1, 4096}, {64, 192}, {64, 1024}, {16, 512}} {
		R, n := sh.R, sh.n
		ctx := n
		kvBytes := int64(R) * int64(n) * nkv * hd * 4 * 2
		auto := kern.AttnTilesSplits(sms, nkv, R)
		variants := []struct {
			name        string
			nsplit      int
			tiles, half bool
		}{{"split_merge", max(1, min(64, 2*sms/(nkv*R))), false, false}, {"tiles_s1", 1, true, false}, {"tiles_s2", 2, true, false}, {"tiles_s4", 4, true, false},
			{fmt.Sprintf("tiles_auto%d", auto), auto, true, false},
			{"tiles_f16_s1", 1, true, true}, {"tiles_f16_s2", 2, true, true}, {fmt.Sprintf("tiles_f16_auto%d", auto), auto, true, true}}
		for _, v := range variants {
			b.Run(fmt.Sprintf("R%d/len%d/%s", R, n, v.name), func(b *testing.B) {
				var bufs []driver.DevicePtr
				var q, kc, vc, pos, slot, part, cnt, out driver.DevicePtr
				err := d.Do(func(c *driver.Ctx) error {
					alloc := func(nb int64, fill uint32) driver.DevicePtr {
						p, err := c.Alloc(nb)
						if err != nil {
							return 0
						}
						bufs = append(bufs, p)
						c.MemsetD32(p, fill, nb/4)
						return p
					}
					q = alloc(4*int64(R*nq*hd), 0x3c000000)
					kc, vc = alloc(4*int64(R)*nkv*int64(ctx)*hd, 0x3c000000), alloc(4*int64(R)*nkv*int64(ctx)*hd, 0x3c000000)
					pos, slot = alloc(4*int64(R), uint32(n-1)), alloc(4*int64(R), 0)
					part, cnt = alloc(4*int64(kern.AttnPartFloats(R, nq, 64, hd)), 0), alloc(4*int64(R*nkv), 0)
					out = alloc(4*int64(R*nq*hd), 0)
					for _, p := range bufs {
						if p == 0 {
							return fmt.Errorf("allocation failed")
						}
					}
					sl := make([]byte, 4*R)
					for r := range R {
						binary.LittleEndian.PutUint32(sl[4*r:], uint32(r))
					}
					return c.HtoD(slot, sl)
				})
				defer d.Do(func(c *driver.Ctx) error {
					for _, p := range bufs {
						c.Free(p)
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				queue := func(c *driver.Ctx) error {
					l := m.On(c, 0, false)
					if v.tiles {
						return l.AttentionTiles(q, nq*hd, kc, vc, pos, slot, part, cnt, out, nq*hd, R, nq, nkv, hd, ctx, v.nsplit, 0.088, v.half, 0)
					}
					return l.Attention(q, nq*hd, kc, vc, pos, slot, part, out, nq*hd, R, nq, nkv, hd, ctx, v.nsplit, 0.088)
				}
				if err := d.Do(queue); err != nil {
					b.Fatal(err)
				}
				ms := timeLaunches(b, d, launches, queue)
				nb := kvBytes
				if v.half {
					nb /= 2
				}
				b.SetBytes(nb * launches)
				sec := float64(ms) / 1e3
				b.ReportMetric(float64(nb)*launches*float64(b.N)/sec/1e9, "GB/s")
				b.ReportMetric(sec/float64(b.N*launches)*1e6, "µs/call")
			})
		}
	}
}
