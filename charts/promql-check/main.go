// Command promql-check renders prometheus-adapter query templates as prometheus-adapter does,
// parses PromQL with Prometheus's own parser and, given samples, evaluates it with Prometheus's
// own engine (charts/validate --autoscaling and tests/triton/test_autoscaling_metrics.py run it).
//
// Input on stdin, a JSON object:
//
//	queries: [{source, kind, text, series}]: kind "template" is a prometheus-adapter
//	  metricsQuery (Go template, delimiters << >>, rendered for a pods query of series `series`),
//	  "expr" a PromQL expression, "selector" a series selector (a seriesQuery).
//	namespace, pods: what the rendered templates select (a namespace, pod names).
//	series: [{labels: {name: value}, samples: [[unix seconds, value], ...]}] (optional).
//	time: unix seconds at which each query is evaluated over `series` (when series is given).
//
// Output on stdout, a JSON list in the order of the queries: the rendered query, the parse or
// evaluation error if any, the vector selectors (metric name, label names matched), the labels
// of by/without/on/ignoring clauses, and the instant vector the query evaluated to (values as
// Go formats them, so NaN and Inf survive JSON).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

type query struct {
	Source string `json:"source"`
	Kind   string `json:"kind"`
	Text   string `json:"text"`
	Series string `json:"series"`
}

type inputSeries struct {
	Labels  map[string]string `json:"labels"`
	Samples [][2]float64      `json:"samples"`
}

type input struct {
	Queries   []query       `json:"queries"`
	Namespace string        `json:"namespace"`
	Pods      []string      `json:"pods"`
	Series    []inputSeries `json:"series"`
	Time      float64       `json:"time"`
}

type selector struct {
	Name   string   `json:"name"`
	Labels []string `json:"labels"`
}

type sample struct {
	Labels map[string]string `json:"labels"`
	Value  string            `json:"value"`
}

type result struct {
	Source    string     `json:"source"`
	Query     string     `json:"query"`
	Error     string     `json:"error,omitempty"`
	Selectors []selector `json:"selectors"`
	Grouping  []string   `json:"grouping"`
	Vector    []sample   `json:"vector"`
}

// templateArgs has the fields of prometheus-adapter's queryTemplateArgs (pkg/naming): a template
// naming any other field fails here as it fails there.
type templateArgs struct {
	Series            string
	LabelMatchers     string
	LabelValuesByName map[string]string
	GroupBy           string
	GroupBySlice      []string
}

// podsQueryArgs are the arguments prometheus-adapter's metricsQuery.Build passes for pods of one
// namespace, as an HPA's Pods metric asks for them: the namespace matched exactly, the pods by
// name (a regex for more than one), grouped by pod.
func podsQueryArgs(series, namespace string, pods []string) templateArgs {
	podMatcher := fmt.Sprintf("pod=%q", pods[0])
	if len(pods) > 1 {
		podMatcher = fmt.Sprintf("pod=~%q", strings.Join(pods, "|"))
	}
	return templateArgs{
		Series:            series,
		LabelMatchers:     fmt.Sprintf("namespace=%q,%s", namespace, podMatcher),
		LabelValuesByName: map[string]string{"namespace": namespace, "pod": strings.Join(pods, "|")},
		GroupBy:           "pod",
		GroupBySlice:      []string{"pod"},
	}
}

func render(q query, in input) (string, error) {
	if q.Kind != "template" {
		return q.Text, nil
	}
	tmpl, err := template.New("metrics-query").Delims("<<", ">>").Option("missingkey=error").Parse(q.Text)
	if err != nil {
		return "", fmt.Errorf("unable to parse metrics query template: %w", err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, podsQueryArgs(q.Series, in.Namespace, in.Pods)); err != nil {
		return "", fmt.Errorf("unable to render metrics query template: %w", err)
	}
	if out.Len() == 0 {
		return "", fmt.Errorf("empty query produced by metrics query template")
	}
	return out.String(), nil
}

func matcherSelector(matchers []*labels.Matcher) selector {
	s := selector{Labels: []string{}}
	for _, m := range matchers {
		if m.Name == labels.MetricName {
			s.Name = m.Value
		} else {
			s.Labels = append(s.Labels, m.Name)
		}
	}
	return s
}

// floatSample is one float sample of a series (chunks.Sample).
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                    { return s.t }
func (floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                  { return s.f }
func (floatSample) H() *histogram.Histogram       { return nil }
func (floatSample) FH() *histogram.FloatHistogram { return nil }
func (floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample         { return s }

// seriesSet iterates over a slice of series (storage.SeriesSet).
type seriesSet struct {
	series []storage.Series
	i      int
}

func (s *seriesSet) Next() bool                      { s.i++; return s.i <= len(s.series) }
func (s *seriesSet) At() storage.Series              { return s.series[s.i-1] }
func (*seriesSet) Err() error                        { return nil }
func (*seriesSet) Warnings() annotations.Annotations { return nil }

// memoryQueryable holds the input series in memory; Select returns those its matchers match.
func memoryQueryable(in []inputSeries) storage.Queryable {
	all := make([]storage.Series, 0, len(in))
	for _, s := range in {
		samples := make([]chunks.Sample, 0, len(s.Samples))
		for _, ts := range s.Samples {
			samples = append(samples, floatSample{t: int64(math.Round(ts[0] * 1000)), f: ts[1]})
		}
		all = append(all, storage.NewListSeries(labels.FromMap(s.Labels), samples))
	}
	sort.Slice(all, func(i, j int) bool { return labels.Compare(all[i].Labels(), all[j].Labels()) < 0 })
	querier := &storage.MockQuerier{
		SelectMockFunction: func(_ bool, _ *storage.SelectHints, matchers ...*labels.Matcher) storage.SeriesSet {
			selected := []storage.Series{}
			for _, s := range all {
				lset := s.Labels()
				ok := true
				for _, m := range matchers {
					ok = ok && m.Matches(lset.Get(m.Name))
				}
				if ok {
					selected = append(selected, s)
				}
			}
			return &seriesSet{series: selected}
		},
	}
	return &storage.MockQueryable{MockQuerier: querier}
}

func evaluate(engine *promql.Engine, queryable storage.Queryable, rendered string, at float64) ([]sample, error) {
	ts := time.UnixMilli(int64(math.Round(at * 1000)))
	q, err := engine.NewInstantQuery(context.Background(), queryable, nil, rendered, ts)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, res.Err
	}
	vector, err := res.Vector()
	if err != nil {
		return nil, err
	}
	out := []sample{}
	for _, s := range vector {
		out = append(out, sample{Labels: s.Metric.Map(), Value: strconv.FormatFloat(s.F, 'g', -1, 64)})
	}
	return out, nil
}

func check(p parser.Parser, engine *promql.Engine, queryable storage.Queryable, q query, in input) result {
	r := result{Source: q.Source, Selectors: []selector{}, Grouping: []string{}, Vector: []sample{}}
	rendered, err := render(q, in)
	r.Query = rendered
	if err != nil {
		r.Error = err.Error()
		return r
	}
	if q.Kind == "selector" {
		matchers, err := p.ParseMetricSelector(rendered)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		r.Selectors = append(r.Selectors, matcherSelector(matchers))
		return r
	}
	expr, err := p.ParseExpr(rendered)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	grouping := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			r.Selectors = append(r.Selectors, matcherSelector(n.LabelMatchers))
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				grouping[l] = true
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				for _, l := range n.VectorMatching.MatchingLabels {
					grouping[l] = true
				}
			}
		}
		return nil
	})
	for l := range grouping {
		r.Grouping = append(r.Grouping, l)
	}
	sort.Strings(r.Grouping)
	if queryable != nil {
		vector, err := evaluate(engine, queryable, rendered, in.Time)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		r.Vector = vector
	}
	return r
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "promql-check: reading the input: %v\n", err)
		os.Exit(2)
	}
	if in.Namespace == "" {
		in.Namespace = "ml"
	}
	if len(in.Pods) == 0 {
		in.Pods = []string{"resnet-7d9c-a", "resnet-7d9c-b"}
	}
	p := parser.NewParser(parser.Options{})
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	var queryable storage.Queryable
	if in.Series != nil {
		queryable = memoryQueryable(in.Series)
	}
	results := make([]result, 0, len(in.Queries))
	for _, q := range in.Queries {
		results = append(results, check(p, engine, queryable, q, in))
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintf(os.Stderr, "promql-check: %v\n", err)
		os.Exit(2)
	}
}
