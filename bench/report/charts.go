package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WriteCharts draws the charts into dir and returns their file names: throughput per system per
// workload, Runnel's ratio to each peer, and latency per system.
func WriteCharts(dir string, r *Results) ([]string, error) {
	var files []string
	if p, w, ok := throughputChart(r); ok {
		if err := save(p, w, 5*vg.Inch, filepath.Join(dir, "throughput.png")); err != nil {
			return nil, err
		}
		files = append(files, "throughput.png")
	}
	if p, w, ok := ratioChart(r); ok {
		if err := save(p, w, 5*vg.Inch, filepath.Join(dir, "ratios.png")); err != nil {
			return nil, err
		}
		files = append(files, "ratios.png")
	}
	if grid, w, h, ok := latencyCharts(r); ok {
		if err := saveGrid(grid, w, h, filepath.Join(dir, "latency.png")); err != nil {
			return nil, err
		}
		files = append(files, "latency.png")
	}
	return files, nil
}

func save(p *plot.Plot, w, h vg.Length, path string) error { return p.Save(w, h, path) }

func saveGrid(grid [][]*plot.Plot, w, h vg.Length, path string) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(grid), Cols: len(grid[0]), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, t, dc)
	for i := range grid {
		for j := range grid[i] {
			if grid[i][j] != nil {
				grid[i][j].Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// palette gives each system the same color in every chart: Runnel in blues, JetStream in greens,
// Redis in reds.
func colorOf(name string, i int) color.Color {
	fixed := map[string]color.RGBA{
		"runnel acks=all":          {0x1f, 0x4e, 0x9c, 0xff},
		"runnel acks=1":            {0x4a, 0x90, 0xd9, 0xff},
		"runnel acks=all no-fsync": {0x8e, 0xc3, 0xf0, 0xff},
		"jetstream":                {0x2e, 0x9e, 0x4f, 0xff},
		"redis always":             {0xc0, 0x39, 0x2b, 0xff},
		"redis everysec":           {0xf0, 0x8a, 0x4b, 0xff},
	}
	if c, ok := fixed[name]; ok {
		return c
	}
	others := []color.RGBA{{0x7b, 0x3f, 0xa0, 0xff}, {0x99, 0x99, 0x33, 0xff}, {0x55, 0x55, 0x55, 0xff}, {0xd4, 0x5d, 0xa8, 0xff}}
	return others[i%len(others)]
}

// bars draws one series of a grouped bar chart on any axis scale (log included): bar i stands at
// x = group i + offset and spans from base to its value.
type bars struct {
	ys     []float64
	offset float64 // within the group, in group units
	width  float64 // in group units
	base   float64
	color  color.Color
}

func (b *bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for i, y := range b.ys {
		if y <= 0 || math.IsNaN(y) {
			continue
		}
		x := float64(i) + b.offset
		x0, x1 := trX(x-b.width/2), trX(x+b.width/2)
		y0, y1 := trY(b.base), trY(y)
		c.FillPolygon(b.color, c.ClipPolygonY([]vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}))
	}
}

func (b *bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = -0.5, float64(len(b.ys))-0.5
	ymin, ymax = math.Inf(1), math.Inf(-1)
	for _, y := range b.ys {
		if y > 0 && !math.IsNaN(y) {
			ymin, ymax = math.Min(ymin, y), math.Max(ymax, y)
		}
	}
	if math.IsInf(ymin, 1) {
		ymin, ymax = b.base, b.base
	}
	return xmin, xmax, math.Min(ymin, b.base), ymax
}

func (b *bars) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}}
	c.FillPolygon(b.color, pts)
}

// hline is a dashed horizontal reference line with a label.
type hline struct {
	y     float64
	label string
	color color.Color
}

func (h *hline) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	_ = trX
	y := trY(h.y)
	sty := draw.LineStyle{Color: h.color, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
	c.StrokeLine2(sty, c.Min.X, y, c.Max.X, y)
	ts := draw.TextStyle{Color: h.color, Font: font.From(plot.DefaultFont, vg.Points(9)), Handler: plot.DefaultTextHandler,
		XAlign: draw.XRight, YAlign: draw.YBottom}
	c.FillText(ts, vg.Point{X: c.Max.X - vg.Points(2), Y: y + vg.Points(1)}, h.label)
}

// decadeTicks labels powers of ten (1k, 10k, 100k, 1M...) with minor ticks at 2 and 5.
type decadeTicks struct{ unit string }

func (d decadeTicks) Ticks(min, max float64) []plot.Tick {
	if min <= 0 {
		min = 1e-3
	}
	var ts []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		v := math.Pow(10, e)
		if v >= min*0.999 && v <= max*1.001 {
			ts = append(ts, plot.Tick{Value: v, Label: human(v) + d.unit})
		}
		for _, m := range []float64{2, 5} {
			if mv := v * m; mv >= min && mv <= max {
				ts = append(ts, plot.Tick{Value: mv, Label: human(mv) + d.unit})
			}
		}
	}
	return ts
}

func human(v float64) string {
	switch {
	case v >= 1e9:
		return trimZero(v/1e9) + "G"
	case v >= 1e6:
		return trimZero(v/1e6) + "M"
	case v >= 1e3:
		return trimZero(v/1e3) + "k"
	}
	return trimZero(v)
}

func trimZero(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// shortID is a workload's label under its group of bars.
func shortID(w Workload) string {
	keys := "no keys"
	if w.Keys {
		keys = "keys"
	}
	switch w.Kind {
	case KindConsume:
		return fmt.Sprintf("consume %s\n%dpart backlog", sizeName(w.Size), w.Partitions)
	case KindLatency, KindEndToEnd:
		if w.PacedAs != "" {
			return fmt.Sprintf("%s %dprod %dpart\n%s @%s's %.0f%%", sizeName(w.Size), w.Producers, w.Partitions, keys, w.PacedAs, 100*w.LoadFraction)
		}
		return fmt.Sprintf("%s %dprod %dpart\n%s @%.0f%%", sizeName(w.Size), w.Producers, w.Partitions, keys, 100*w.LoadFraction)
	}
	return fmt.Sprintf("%s %dprod\n%dpart %s", sizeName(w.Size), w.Producers, w.Partitions, keys)
}

func newPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Y.Label.Text = ylabel
	p.Y.Scale = plot.LogScale{}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.X.Tick.Label.Font.Size = vg.Points(9)
	return p
}

// groupPlot fills p with one series per name over the groups, returns the lowest value seen.
func groupPlot(p *plot.Plot, names []string, groups []string, value func(name string, g int) float64) ([]*bars, bool) {
	lo, hi := math.Inf(1), math.Inf(-1)
	vals := make([][]float64, len(names))
	for i, n := range names {
		vals[i] = make([]float64, len(groups))
		for g := range groups {
			v := value(n, g)
			vals[i][g] = v
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		return nil, false
	}
	base := math.Pow(10, math.Floor(math.Log10(lo)))
	width := 0.8 / float64(len(names))
	series := make([]*bars, len(names))
	for i, n := range names {
		b := &bars{ys: vals[i], offset: -0.4 + width*(float64(i)+0.5), width: width * 0.9, base: base, color: colorOf(n, i)}
		p.Add(b)
		p.Legend.Add(n, b)
		series[i] = b
	}
	ticks := make(plot.ConstantTicks, len(groups))
	for g, label := range groups {
		ticks[g] = plot.Tick{Value: float64(g), Label: label}
	}
	p.X.Tick.Marker = ticks
	p.X.Min, p.X.Max = -0.5, float64(len(groups))-0.5
	p.Y.Min = base
	p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi*1.05))+0.6) // room for the legend
	p.Y.Tick.Marker = decadeTicks{}
	return series, true
}

// systemNames returns the systems that have runs, in the order of r.Systems.
func systemNames(r *Results, kinds ...string) []string {
	has := map[string]bool{}
	for _, run := range r.Runs {
		for _, k := range kinds {
			if run.Workload.Kind == k && run.RecordsPerSec > 0 {
				has[run.System] = true
			}
		}
	}
	var out []string
	for _, name := range r.SystemOrder() {
		if has[name] {
			out = append(out, name)
		}
	}
	return out
}

func throughputWorkloads(r *Results) []Workload {
	var ws []Workload
	for _, w := range r.Workloads() {
		if w.Kind == KindProduce || w.Kind == KindConsume {
			ws = append(ws, w)
		}
	}
	return ws
}

func throughputChart(r *Results) (*plot.Plot, vg.Length, bool) {
	ws := throughputWorkloads(r)
	names := systemNames(r, KindProduce, KindConsume)
	if len(ws) == 0 || len(names) == 0 {
		return nil, 0, false
	}
	p := newPlot("Throughput per system and workload (records/s, log scale; higher is better)", "records/s")
	groups := make([]string, len(ws))
	for i, w := range ws {
		groups[i] = shortID(w)
	}
	_, ok := groupPlot(p, names, groups, func(n string, g int) float64 {
		run, _ := r.Find(ws[g].ID(), n)
		return run.RecordsPerSec
	})
	return p, width(len(ws), len(names)), ok
}

func width(groups, series int) vg.Length {
	w := vg.Length(groups*series)*0.22*vg.Inch + 2*vg.Inch
	if w < 8*vg.Inch {
		w = 8 * vg.Inch
	}
	return w
}

// ratioPairs are the comparisons the ratio chart shows: Runnel configuration ÷ peer.
var ratioPairs = [][2]string{
	{"runnel acks=all no-fsync", "jetstream"},
	{"runnel acks=all", "jetstream"},
	{"runnel acks=all", "redis always"},
	{"runnel acks=all no-fsync", "redis everysec"},
}

func ratioChart(r *Results) (*plot.Plot, vg.Length, bool) {
	ws := throughputWorkloads(r)
	if len(ws) == 0 {
		return nil, 0, false
	}
	var names []string
	var pairs [][2]string
	for _, pr := range ratioPairs {
		runnel, peer := pr[0], pr[1]
		if pr[0] == "runnel acks=all no-fsync" {
			if _, ok := r.System(runnel); !ok { // fall back on acks=1, the same durability class
				runnel = "runnel acks=1"
			}
		}
		_, okA := r.System(runnel)
		_, okB := r.System(peer)
		if okA && okB {
			pairs = append(pairs, [2]string{runnel, peer})
			names = append(names, runnel+" ÷ "+peer)
		}
	}
	if len(pairs) == 0 {
		return nil, 0, false
	}
	p := newPlot("Runnel's throughput ÷ each peer's (log scale; dashed: issue 9's 10× target; consume: runnel acks=all)", "ratio")
	groups := make([]string, len(ws))
	for i, w := range ws {
		groups[i] = shortID(w)
	}
	value := func(n string, g int) float64 {
		for i, nm := range names {
			if nm == n {
				a, ok := r.Find(ws[g].ID(), pairs[i][0])
				if !ok { // consume runs once per server: Runnel's read path is the acks=all run's
					a, _ = r.Find(ws[g].ID(), "runnel acks=all")
				}
				b, _ := r.Find(ws[g].ID(), pairs[i][1])
				if a.RecordsPerSec > 0 && b.RecordsPerSec > 0 {
					return a.RecordsPerSec / b.RecordsPerSec
				}
			}
		}
		return 0
	}
	series, ok := groupPlot(p, names, groups, value)
	if !ok {
		return nil, 0, false
	}
	for i, b := range series { // colored by pair: green against JetStream, red against Redis
		b.color = pairColor(pairs[i])
	}
	if p.Y.Min > 0.5 {
		p.Y.Min = 0.1
	}
	if p.Y.Max < 20 {
		p.Y.Max = 40
	}
	p.Y.Tick.Marker = decadeTicks{unit: "×"}
	p.Add(&hline{y: 1, label: "1×", color: color.Gray{0x60}}, &hline{y: 10, label: "10× target", color: color.RGBA{0xc0, 0x39, 0x2b, 0xff}})
	return p, width(len(ws), len(names)), true
}

func pairColor(pr [2]string) color.Color {
	switch pr {
	case [2]string{"runnel acks=all no-fsync", "jetstream"}, [2]string{"runnel acks=1", "jetstream"}:
		return color.RGBA{0x2e, 0x9e, 0x4f, 0xff}
	case [2]string{"runnel acks=all", "jetstream"}:
		return color.RGBA{0x9c, 0xd6, 0xa8, 0xff}
	case [2]string{"runnel acks=all", "redis always"}:
		return color.RGBA{0xc0, 0x39, 0x2b, 0xff}
	}
	return color.RGBA{0xf0, 0x8a, 0x4b, 0xff}
}

// latencyCharts returns a grid with a row per paced shape: the ack latency of its latency run (no
// consumer) and the end-to-end latency of its e2e run (a consumer reading along), p50, p99 and p99.9
// per system.
func latencyCharts(r *Results) ([][]*plot.Plot, vg.Length, vg.Length, bool) {
	var grid [][]*plot.Plot
	var wmax vg.Length
	seen := map[string]bool{}
	for _, w := range r.Workloads() {
		if w.Kind != KindLatency && w.Kind != KindEndToEnd {
			continue
		}
		lw, ew := w, w
		lw.Kind, ew.Kind = KindLatency, KindEndToEnd
		if seen[lw.ID()] {
			continue
		}
		seen[lw.ID()] = true
		row := make([]*plot.Plot, 2)
		for col, cw := range []Workload{lw, ew} {
			var runs []Run
			for _, run := range r.runsOf(cw.ID()) { // at another system's rate: that system's own run too
				s := run.Latency
				if col == 1 {
					s = run.EndToEnd
				}
				if s != nil && s.Count > 0 {
					runs = append(runs, run)
				}
			}
			if len(runs) == 0 {
				continue
			}
			groups := make([]string, len(runs))
			for i, run := range runs {
				groups[i] = strings.Replace(run.System, " ", "\n", 1)
			}
			what := "produce (ack) latency, no consumer"
			if col == 1 {
				what = "end-to-end latency, consumer reading along"
			}
			p := newPlot(fmt.Sprintf("%s\n%s (ms, log scale; lower is better)", what, strings.ReplaceAll(shortID(cw), "\n", " ")), "milliseconds")
			series, ok := groupPlot(p, []string{"p50", "p99", "p99.9"}, groups, func(n string, g int) float64 {
				s := runs[g].Latency
				if col == 1 {
					s = runs[g].EndToEnd
				}
				switch n {
				case "p50":
					return s.P50Ms
				case "p99":
					return s.P99Ms
				}
				return s.P999Ms
			})
			if !ok {
				continue
			}
			shades := []color.Color{color.RGBA{0x9e, 0xc5, 0xe8, 0xff}, color.RGBA{0x3a, 0x7c, 0xc0, 0xff}, color.RGBA{0x12, 0x2f, 0x5e, 0xff}}
			for i, b := range series {
				b.color = shades[i]
			}
			row[col] = p
			if wl := width(len(runs), 3); wl > wmax {
				wmax = wl
			}
		}
		if row[0] == nil && row[1] == nil {
			continue
		}
		for i := range row {
			if row[i] == nil {
				row[i] = plot.New()
				row[i].HideAxes()
			}
		}
		grid = append(grid, row)
	}
	if len(grid) == 0 {
		return nil, 0, 0, false
	}
	return grid, 2 * wmax, vg.Length(len(grid)) * 5 * vg.Inch, true
}
