// Command upstream-diff answers HPA and VPA cases with upstream's own code, for the recommender's
// differential test (services/recommender/tests/upstream_diff.rs).
//
// It reads one JSON case per line on stdin and writes one JSON answer per line on stdout:
//   - {"kind":"hpa", ...}: k8s.io/kubernetes/pkg/controller/podautoscaler ReplicaCalculator.
//     GetResourceReplicas for CPU, fed through the interfaces it takes — a MetricsClient returning
//     the case's per-pod metrics and a pod lister over an indexer holding the case's pods with
//     their phase, readiness condition and start time (as upstream's replica_calculator_test.go
//     does), with the controller's default CPU initialization period (5 min) and initial
//     readiness delay (30 s).
//   - {"kind":"vpa", ...}: k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/{model,logic}:
//     one AggregateContainerState fed by one ContainerState per pod (CPU samples, memory samples,
//     OOMs through ContainerState.AddSample and RecordOOM), then the PodResourceRecommender of
//     logic.CreatePodResourceRecommender with the recommender's default configuration
//     (config.DefaultRecommenderConfig) for its target, lower and upper bounds.
//
// Nothing here re-implements upstream logic: every number in an answer is computed by the
// upstream packages above.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"time"
	"unsafe"

	autoscaling "k8s.io/api/autoscaling/v2"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/controller/podautoscaler"
	metricsclient "k8s.io/kubernetes/pkg/controller/podautoscaler/metrics"

	vpaconfig "k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/config"
	"k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/logic"
	"k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/model"
)

// The kube-controller-manager defaults of --horizontal-pod-autoscaler-cpu-initialization-period
// and --horizontal-pod-autoscaler-initial-readiness-delay.
const (
	cpuInitializationPeriod       = 5 * time.Minute
	delayOfInitialReadinessStatus = 30 * time.Second
	metricWindow                  = 30 * time.Second
	namespace                     = "ns"
)

type hpaPod struct {
	// "ready", "missing" (ready, no metric), "pending" (phase Pending, no metric), "not_ready"
	// (running, Ready=False and never ready, metric present) or "initializing" (Ready=True
	// within the CPU initialization period, metric taken before a full window since).
	State     string `json:"state"`
	Nanocores int64  `json:"nanocores"`
}

type hpaCase struct {
	Current       int32    `json:"current"`
	TargetPercent int32    `json:"target_percent"`
	Tolerance     float64  `json:"tolerance"`
	RequestMilli  int64    `json:"request_milli"`
	Pods          []hpaPod `json:"pods"`
}

type vpaEvent struct {
	T int64 `json:"t"`
	// Exactly one of the three below.
	CPUCores          *float64 `json:"cpu_cores,omitempty"`
	Pods              int      `json:"pods,omitempty"`
	MemBytes          *float64 `json:"mem_bytes,omitempty"`
	OOMRequestedBytes *float64 `json:"oom_requested_bytes,omitempty"`
}

type vpaCase struct {
	Events []vpaEvent `json:"events"`
}

type input struct {
	ID   int    `json:"id"`
	Kind string `json:"kind"`
	hpaCase
	vpaCase
}

type answer struct {
	ID    int    `json:"id"`
	Error string `json:"error,omitempty"`
	// HPA
	Replicas    *int32 `json:"replicas,omitempty"`
	Utilization *int32 `json:"utilization,omitempty"`
	// VPA: millicores and bytes.
	Target *[2]int64 `json:"target,omitempty"`
	Lower  *[2]int64 `json:"lower,omitempty"`
	Upper  *[2]int64 `json:"upper,omitempty"`
	// OOMs upstream discarded (RecordOOM returned an error).
	OOMsDiscarded int `json:"ooms_discarded"`
}

// fixedMetrics is a MetricsClient answering with the case's per-pod CPU metrics.
type fixedMetrics struct {
	metrics   metricsclient.PodMetricsInfo
	timestamp time.Time
}

func (f *fixedMetrics) GetResourceMetric(_ context.Context, res v1.ResourceName, _ string, _ labels.Selector, _ string) (metricsclient.PodMetricsInfo, time.Time, error) {
	if res != v1.ResourceCPU {
		return nil, time.Time{}, fmt.Errorf("only cpu metrics, not %s", res)
	}
	out := make(metricsclient.PodMetricsInfo, len(f.metrics))
	for k, v := range f.metrics {
		out[k] = v
	}
	return out, f.timestamp, nil
}

func (f *fixedMetrics) GetRawMetric(string, string, labels.Selector, labels.Selector) (metricsclient.PodMetricsInfo, time.Time, error) {
	return nil, time.Time{}, errors.New("no raw metrics")
}

func (f *fixedMetrics) GetObjectMetric(string, string, *autoscaling.CrossVersionObjectReference, labels.Selector) (int64, time.Time, error) {
	return 0, time.Time{}, errors.New("no object metrics")
}

func (f *fixedMetrics) GetExternalMetric(string, string, labels.Selector) ([]int64, time.Time, error) {
	return nil, time.Time{}, errors.New("no external metrics")
}

// tolerances builds podautoscaler.Tolerances{scaleDown: t, scaleUp: t}. Its fields are
// unexported and the package has no constructor (the controller builds it from its
// --horizontal-pod-autoscaler-tolerance flag), so they are set by name through reflection; a
// renamed field panics instead of silently leaving a zero tolerance.
func tolerances(t float64) podautoscaler.Tolerances {
	var tol podautoscaler.Tolerances
	v := reflect.ValueOf(&tol).Elem()
	for _, name := range []string{"scaleDown", "scaleUp"} {
		f := v.FieldByName(name)
		if !f.IsValid() || f.Kind() != reflect.Float64 {
			panic(fmt.Sprintf("podautoscaler.Tolerances has no float64 field %q", name))
		}
		reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().SetFloat(t)
	}
	return tol
}

func runHPA(c *hpaCase) answer {
	now := time.Now()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	metrics := metricsclient.PodMetricsInfo{}
	for i, p := range c.Pods {
		name := fmt.Sprintf("pod-%d", i)
		started := metav1.NewTime(now.Add(-time.Hour))
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": "t"}},
			Spec: v1.PodSpec{Containers: []v1.Container{{
				Name: "c",
				Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
					v1.ResourceCPU: *resource.NewMilliQuantity(c.RequestMilli, resource.DecimalSI),
				}},
			}}},
			Status: v1.PodStatus{Phase: v1.PodRunning, StartTime: &started},
		}
		ready := v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(-59 * time.Minute))}
		metricAt := now
		withMetric := true
		switch p.State {
		case "ready":
		case "missing":
			withMetric = false
		case "pending":
			pod.Status.Phase = v1.PodPending
			withMetric = false
		case "not_ready":
			ready.Status = v1.ConditionFalse
			ready.LastTransitionTime = metav1.NewTime(started.Add(10 * time.Second))
		case "initializing":
			recent := metav1.NewTime(now.Add(-time.Minute))
			pod.Status.StartTime = &recent
			ready.LastTransitionTime = metav1.NewTime(now.Add(-10 * time.Second))
		default:
			return answer{Error: "unknown pod state " + p.State}
		}
		pod.Status.Conditions = []v1.PodCondition{ready}
		if err := indexer.Add(pod); err != nil {
			return answer{Error: err.Error()}
		}
		if withMetric {
			// What the resource metrics API client does: the pod's CPU usage as a Quantity
			// (metrics-server reports nanocores) read with MilliValue, which rounds up.
			q := resource.NewScaledQuantity(p.Nanocores, resource.Nano)
			metrics[name] = metricsclient.PodMetric{Timestamp: metricAt, Window: metricWindow, Value: q.MilliValue()}
		}
	}
	calc := podautoscaler.NewReplicaCalculator(&fixedMetrics{metrics: metrics, timestamp: now},
		corelisters.NewPodLister(indexer), cpuInitializationPeriod, delayOfInitialReadinessStatus)
	sel := labels.SelectorFromSet(labels.Set{"app": "t"})
	replicas, util, _, _, err := calc.GetResourceReplicas(context.Background(), c.Current, c.TargetPercent,
		v1.ResourceCPU, tolerances(c.Tolerance), namespace, sel, "")
	if err != nil {
		return answer{Error: err.Error()}
	}
	return answer{Replicas: &replicas, Utilization: &util}
}

func runVPA(c *vpaCase) answer {
	// Sample times are seconds from the Unix epoch, a whole number of days after Go's zero time,
	// so the decaying histograms' reference time (rounded to the half life) starts where the
	// port's does.
	base := time.Unix(0, 0).UTC()
	at := func(t int64) time.Time { return base.Add(time.Duration(t) * time.Second) }
	agg := model.NewAggregateContainerState()
	var containers []*model.ContainerState
	container := func(i int) *model.ContainerState {
		for len(containers) <= i {
			containers = append(containers, model.NewContainerState(model.Resources{}, agg))
		}
		return containers[i]
	}
	discarded := 0
	for _, e := range c.Events {
		switch {
		case e.CPUCores != nil:
			for i := 0; i < e.Pods; i++ {
				container(i).AddSample(&model.ContainerUsageSample{
					MeasureStart: at(e.T), Usage: model.CPUAmountFromCores(*e.CPUCores), Resource: model.ResourceCPU,
				})
			}
		case e.MemBytes != nil:
			container(0).AddSample(&model.ContainerUsageSample{
				MeasureStart: at(e.T), Usage: model.MemoryAmountFromBytes(*e.MemBytes), Resource: model.ResourceMemory,
			})
		case e.OOMRequestedBytes != nil:
			if err := container(0).RecordOOM(at(e.T), model.MemoryAmountFromBytes(*e.OOMRequestedBytes)); err != nil {
				discarded++
			}
		}
	}
	d := vpaconfig.DefaultRecommenderConfig()
	rec := logic.CreatePodResourceRecommender(logic.RecommendationConfig{
		SafetyMarginFraction:       d.SafetyMarginFraction,
		PodMinCPUMillicores:        d.PodMinCPUMillicores,
		PodMinMemoryMb:             d.PodMinMemoryMb,
		TargetCPUPercentile:        d.TargetCPUPercentile,
		LowerBoundCPUPercentile:    d.LowerBoundCPUPercentile,
		UpperBoundCPUPercentile:    d.UpperBoundCPUPercentile,
		ConfidenceIntervalCPU:      d.ConfidenceIntervalCPU,
		TargetMemoryPercentile:     d.TargetMemoryPercentile,
		LowerBoundMemoryPercentile: d.LowerBoundMemoryPercentile,
		UpperBoundMemoryPercentile: d.UpperBoundMemoryPercentile,
		ConfidenceIntervalMemory:   d.ConfidenceIntervalMemory,
	})
	r := rec.GetRecommendedPodResources(model.ContainerNameToAggregateStateMap{"c": agg})["c"]
	pair := func(res model.Resources) *[2]int64 {
		return &[2]int64{int64(res[model.ResourceCPU]), int64(res[model.ResourceMemory])}
	}
	return answer{Target: pair(r.Target), Lower: pair(r.LowerBound), Upper: pair(r.UpperBound), OOMsDiscarded: discarded}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var c input
		var a answer
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			fmt.Fprintf(os.Stderr, "upstream-diff: bad case: %v\n", err)
			os.Exit(2)
		}
		switch c.Kind {
		case "hpa":
			a = runHPA(&c.hpaCase)
		case "vpa":
			a = runVPA(&c.vpaCase)
		default:
			fmt.Fprintf(os.Stderr, "upstream-diff: unknown kind %q\n", c.Kind)
			os.Exit(2)
		}
		a.ID = c.ID
		if err := enc.Encode(a); err != nil {
			fmt.Fprintf(os.Stderr, "upstream-diff: %v\n", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "upstream-diff: %v\n", err)
		os.Exit(1)
	}
}
