// stsa._stsa: the extension module behind the Python package (python/stsa).
// It binds the library's entry points on arrays the caller owns; allocating
// outputs in the caller's framework and the keyword defaults live in Python.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "plan_arrays.hpp"
#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/plan.hpp"
#include "stsa/policy.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/version.hpp"
#include "targets.hpp"
#include "tensor_args.hpp"
#include "values.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace stsa::python {
namespace {

// One cache for the process: plans are immutable and keyed by value, so every
// call on the same grid, mask and tile shape shares them (layers, steps, heads).
PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

// Runs `work` with the GIL released: other Python threads go on while the
// backend computes (the arrays stay referenced by the caller's arguments).
template <class Work>
auto without_gil(Work&& work) -> decltype(work()) {
  nb::gil_scoped_release unlocked;
  return work();
}

using BitViews = std::map<std::string, std::string>;
// A per-(batch, head) descale as the Python layer hands it over: [B, H] float32 on the host.
using DescaleArray = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OptionalDescale = std::optional<DescaleArray>;

// The tensors of a call, as the Python layer hands them over; `bit_views`
// maps those that are unsigned-integer views ("q", "k", "v", "out") to the type
// of their values ("bf16", "fp8_e4m3").
struct Tensors {
  InputArray q, k, v;
  std::optional<OutputArray> o, lse;  // none for routing alone
  BitViews bit_views;
  OptionalDescale q_descale, k_descale, v_descale;

  std::optional<DType> bits_of(const char* name) const {
    const auto view = bit_views.find(name);
    if (view == bit_views.end()) return std::nullopt;
    return parse_dtype(view->second);
  }
};

// Where all of a call's arrays are: one place, or InvalidArgument naming the first that differs.
Placement call_placement(const Tensors& t) {
  const Placement place = placement_of(t.q, "q");
  auto same = [&](const auto& array, const char* name) {
    const Placement other = placement_of(array, name);
    STSA_CHECK(other == place, InvalidArgument, name, " is in ",
               other.gpu ? detail::concat("CUDA device ", other.device, "'s memory") : std::string("host memory"),
               " and q in ", place.gpu ? detail::concat("CUDA device ", place.device, "'s") : std::string("host"),
               " memory: a call's arrays must all be in one place");
  };
  same(t.k, "k");
  same(t.v, "v");
  if (t.o) same(*t.o, "out");
  if (t.lse) same(*t.lse, "lse");
  return place;
}

RoutedCall routed_call(const Tensors& t, const VideoGrid& grid, const std::string& layout, float scale) {
  const AxisOrder axes = parse_axis_order(layout);
  RoutedCall call;
  call.q = tensor_view(t.q, "q", axes, t.bits_of("q"));
  call.k = tensor_view(t.k, "k", axes, t.bits_of("k"));
  call.v = tensor_view(t.v, "v", axes, t.bits_of("v"));
  narrow_heads_broadcast(call.k, call.v, call.q.heads());
  if (t.o) call.o = tensor_view(*t.o, "out", axes, t.bits_of("out"));
  if (t.lse) call.lse = lse_view(*t.lse, "lse");
  call.layout = VideoLayout{grid, call.q.batch(), call.q.heads(), call.q.head_dim()};
  call.softmax_scale = scale;
  // Spans over the caller's arrays (which the call's arguments keep alive); the library checks their sizes.
  const auto values = [](const OptionalDescale& a) {
    return a ? std::span<const float>(a->data(), a->size()) : std::span<const float>{};
  };
  call.descales = Descales{values(t.q_descale), values(t.k_descale), values(t.v_descale)};
  return call;
}

TileShape tile_shape(std::int32_t tile_q, std::int32_t tile_k) {
  const TileShape tile{tile_q, tile_k};
  tile.validate();
  return tile;
}

RoutedOptions routed_options(std::int32_t tile_q, std::int32_t tile_k, const std::string& align, bool timed) {
  RoutedOptions options;
  options.tile = tile_shape(tile_q, tile_k);
  options.alignment = parse_alignment(align);
  options.timed = timed;
  return options;
}

RouterOptions router_options(int samples, double spatial_density, double temporal_density, double frames_density,
                             bool try_frames, double max_rel_l2, bool anchor, std::uint64_t seed) {
  RouterOptions options;
  options.samples = samples;
  options.spatial_density = spatial_density;
  options.temporal_density = temporal_density;
  options.frame_window_density = frames_density;
  options.try_frame_window = try_frames;
  options.max_rel_l2 = max_rel_l2;
  options.anchor = anchor;
  options.seed = seed;
  options.validate();
  return options;
}

// Options that size every kind of mask to one kept density (route_spec reads them). Checked here,
// in the caller's words: no router is involved, so the router's field names would mislead.
RouterOptions one_density(double density, bool anchor) {
  STSA_CHECK(density >= 0 && density <= 1, InvalidArgument, "density must be in [0, 1], got ", density);
  RouterOptions options;
  options.spatial_density = options.temporal_density = options.frame_window_density = density;
  options.anchor = anchor;
  options.validate();
  return options;
}

// The mask a name gives ("dense", "spatial", "temporal", "frames"), refused in the argument's words.
Route parse_mask(const std::string& name) {
  for (const Route r : {Route::Dense, Route::Spatial, Route::Temporal, Route::FrameWindow})
    if (name == to_string(r)) return r;
  throw InvalidArgument(
      detail::concat("mask must be 'dense', 'spatial', 'temporal' or 'frames', got '", name, "'"));
}

// The cached plan of the mask `mask` names, sized to `density`.
std::shared_ptr<const TilePlan> plan_of(const VideoGrid& grid, const std::string& mask, double density, bool anchor,
                                        std::int32_t tile_q, std::int32_t tile_k, const std::string& align) {
  const MaskSpec spec = route_spec(grid, parse_mask(mask), one_density(density, anchor));
  return plan_cache().get(grid, spec, tile_shape(tile_q, tile_k), parse_alignment(align));
}

// One mask name for every head, or one per head.
void check_mask_count(const std::vector<std::string>& masks, std::int64_t heads) {
  STSA_CHECK(masks.size() == 1 || std::int64_t(masks.size()) == heads, InvalidArgument,
             "mask must name one mask for every head or one per head (", heads, "), got ", masks.size());
}

// Given masks, one name for every head or one per head.
nb::dict attention(const Tensors& t, const VideoGrid& grid, const std::vector<std::string>& masks, double density,
                   bool anchor, float scale, const Target& target, std::int32_t tile_q, std::int32_t tile_k,
                   const std::string& align, const std::string& layout) {
  const RoutedCall call = routed_call(t, grid, layout, scale);
  // Nobody reads this call's times: untimed, a GPU call returns once enqueued, as torch's own ops do.
  const RoutedOptions options = routed_options(tile_q, tile_k, align, /*timed=*/false);
  const std::int64_t heads = call.layout.heads;
  check_mask_count(masks, heads);
  const RouterOptions densities = one_density(density, anchor);
  std::vector<HeadRoute> decisions(std::size_t(std::max<std::int64_t>(heads, 0)));
  for (std::size_t h = 0; h < decisions.size(); ++h) {
    decisions[h].route = parse_mask(masks[masks.size() == 1 ? 0 : h]);
    decisions[h].spec = route_spec(grid, decisions[h].route, densities);
  }
  return result_dict(without_gil([&] { return run_given(target, plan_cache(), call, std::move(decisions), options); }));
}

nb::dict routed_attention(const Tensors& t, const VideoGrid& grid, const RouterOptions& router, float scale,
                          const Target& target, std::int32_t tile_q, std::int32_t tile_k, const std::string& align,
                          const std::string& layout, bool timed) {
  const RoutedCall call = routed_call(t, grid, layout, scale);
  const RoutedOptions options = routed_options(tile_q, tile_k, align, timed);
  return result_dict(without_gil([&] { return run_routing(target, plan_cache(), call, Router(router), options); }));
}

// Python exceptions that keep the library's hierarchy (stsa.Error) and the
// built-in kind a caller would catch (ValueError for a bad argument).
void register_errors(nb::module_& m) {
  static PyObject* error = PyErr_NewException("stsa.Error", PyExc_RuntimeError, nullptr);
  auto derived = [](const char* name, PyObject* builtin) {
    PyObject* bases = PyTuple_Pack(2, error, builtin);
    PyObject* type = PyErr_NewException(name, bases, nullptr);
    Py_DECREF(bases);
    return type;
  };
  static PyObject* invalid = derived("stsa.InvalidArgument", PyExc_ValueError);
  static PyObject* unsupported = derived("stsa.Unsupported", PyExc_NotImplementedError);
  static PyObject* resource = derived("stsa.ResourceError", PyExc_MemoryError);
  static PyObject* io = derived("stsa.IoError", PyExc_OSError);
  m.attr("Error") = nb::handle(error);
  m.attr("InvalidArgument") = nb::handle(invalid);
  m.attr("Unsupported") = nb::handle(unsupported);
  m.attr("ResourceError") = nb::handle(resource);
  m.attr("IoError") = nb::handle(io);
  m.attr("__version__") = std::string(stsa::version);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(invalid, e.what());
    } catch (const Unsupported& e) {
      PyErr_SetString(unsupported, e.what());
    } catch (const ResourceError& e) {
      PyErr_SetString(resource, e.what());
    } catch (const IoError& e) {
      PyErr_SetString(io, e.what());
    } catch (const Error& e) {
      PyErr_SetString(error, e.what());
    } catch (const std::bad_alloc&) {
      // An allocation too large for the host (a plan for a huge grid, say): stsa.ResourceError,
      // which is a MemoryError as nanobind's own translation would be, and a stsa.Error.
      PyErr_SetString(resource, "out of host memory (std::bad_alloc)");
    }
  });
}

// The tensor arguments every attention entry point takes, in this order.
#define STSA_TENSOR_ARGS \
  "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "bit_views"_a, "q_descale"_a.none(), "k_descale"_a.none(), \
      "v_descale"_a.none()
// Those of routing alone (no outputs).
#define STSA_ROUTING_ARGS \
  "q"_a, "k"_a, "v"_a, "bit_views"_a, "q_descale"_a.none(), "k_descale"_a.none(), "v_descale"_a.none()

}  // namespace
}  // namespace stsa::python

NB_MODULE(_stsa, m) {
  using namespace stsa;
  using namespace stsa::python;
  m.doc() = "stsa's extension module; use the stsa package, which wraps it.";
  // A Policy that torch.compile's caches (or any module-level object) still hold at
  // interpreter exit is not a leak, but nanobind would print "leaked instances" for it.
  nb::set_leak_warnings(false);
  register_errors(m);

  // The library's grid, validated on construction; stsa.VideoGrid (Python) is the value users hold.
  nb::class_<VideoGrid>(m, "VideoGrid", "Latent frames x token rows x token columns, and text tokens before or after.")
      .def(
          "__init__",
          [](VideoGrid* self, std::int64_t frames, std::int64_t height, std::int64_t width, std::int64_t text,
             const std::string& text_placement) {
            STSA_CHECK(text_placement == "before" || text_placement == "after", InvalidArgument,
                       "text_placement must be 'before' or 'after', got '", text_placement, "'");
            VideoGrid grid{frames, height, width, text,
                           text_placement == "before" ? TextPlacement::Before : TextPlacement::After};
            grid.validate();
            new (self) VideoGrid(grid);
          },
          "frames"_a, "height"_a, "width"_a, "text"_a = 0, "text_placement"_a = "after")
      .def_ro("frames", &VideoGrid::frames)
      .def_ro("height", &VideoGrid::height)
      .def_ro("width", &VideoGrid::width)
      .def_ro("text", &VideoGrid::text_tokens)
      .def_prop_ro("text_placement", [](const VideoGrid& g) { return std::string(to_string(g.text_placement)); });

  m.def(
      "attention",
      [](InputArray q, InputArray k, InputArray v, OutputArray out, std::optional<OutputArray> lse,
         const BitViews& bit_views, OptionalDescale q_descale, OptionalDescale k_descale, OptionalDescale v_descale,
         const VideoGrid& grid, const std::vector<std::string>& masks, double density, bool anchor, float scale,
         const std::string& backend, std::uintptr_t stream, std::int32_t tile_q, std::int32_t tile_k,
         const std::string& align, const std::string& layout) {
        const Tensors t{q, k, v, out, lse, bit_views, q_descale, k_descale, v_descale};
        return attention(t, grid, masks, density, anchor, scale, target_for(backend, call_placement(t), stream), tile_q,
                         tile_k, align, layout);
      },
      STSA_TENSOR_ARGS, "grid"_a, "masks"_a, "density"_a, "anchor"_a, "scale"_a, "backend"_a, "stream"_a, "tile_q"_a,
      "tile_k"_a, "align"_a, "layout"_a);

  m.def(
      "routed_attention",
      [](InputArray q, InputArray k, InputArray v, OutputArray out, std::optional<OutputArray> lse,
         const BitViews& bit_views, OptionalDescale q_descale, OptionalDescale k_descale, OptionalDescale v_descale,
         const VideoGrid& grid, int samples, double spatial_density,
         double temporal_density, double frames_density, bool try_frames, double max_rel_l2, bool anchor,
         std::uint64_t seed, float scale, const std::string& backend, std::uintptr_t stream, std::int32_t tile_q,
         std::int32_t tile_k, const std::string& align, const std::string& layout, bool timed) {
        const RouterOptions router = router_options(samples, spatial_density, temporal_density, frames_density,
                                                    try_frames, max_rel_l2, anchor, seed);
        const Tensors t{q, k, v, out, lse, bit_views, q_descale, k_descale, v_descale};
        return routed_attention(t, grid, router, scale, target_for(backend, call_placement(t), stream), tile_q, tile_k,
                                align, layout, timed);
      },
      STSA_TENSOR_ARGS, "grid"_a, "samples"_a, "spatial_density"_a, "temporal_density"_a, "frames_density"_a,
      "try_frames"_a, "max_rel_l2"_a, "anchor"_a, "seed"_a, "scale"_a, "backend"_a, "stream"_a, "tile_q"_a, "tile_k"_a,
      "align"_a, "layout"_a, "timed"_a);

  m.def(
      "route",
      [](InputArray q, InputArray k, InputArray v, const BitViews& bit_views, OptionalDescale q_descale,
         OptionalDescale k_descale, OptionalDescale v_descale, const VideoGrid& grid, int samples,
         double spatial_density, double temporal_density, double frames_density, bool try_frames,
         double max_rel_l2, bool anchor, std::uint64_t seed, float scale, std::uintptr_t stream,
         const std::string& layout) {
        const Router router(router_options(samples, spatial_density, temporal_density, frames_density, try_frames,
                                           max_rel_l2, anchor, seed));
        const Tensors t{q, k, v, std::nullopt, std::nullopt, bit_views, q_descale, k_descale, v_descale};
        const Target target = target_for("", call_placement(t), stream);
        const RoutedCall call = routed_call(t, grid, layout, scale);
        return routing_dict(without_gil([&] { return route_on(target, router, call, {}); }));
      },
      STSA_ROUTING_ARGS, "grid"_a, "samples"_a, "spatial_density"_a, "temporal_density"_a, "frames_density"_a,
      "try_frames"_a, "max_rel_l2"_a, "anchor"_a, "seed"_a, "scale"_a, "stream"_a, "layout"_a);

  nb::class_<Policy>(m, "Policy")
      .def(
          "__init__",
          [](Policy* self, std::int64_t dense_steps, std::int64_t dense_layers, std::int64_t reuse_steps, int samples,
             double spatial_density, double temporal_density, double frames_density, bool try_frames, double max_rel_l2,
             bool anchor, std::uint64_t seed) {
            PolicyOptions options;
            options.dense_steps = dense_steps;
            options.dense_layers = dense_layers;
            options.reuse_steps = reuse_steps;
            options.router = router_options(samples, spatial_density, temporal_density, frames_density, try_frames,
                                            max_rel_l2, anchor, seed);
            options.validate();
            new (self) Policy(options);
          },
          "dense_steps"_a, "dense_layers"_a, "reuse_steps"_a, "samples"_a, "spatial_density"_a, "temporal_density"_a,
          "frames_density"_a, "try_frames"_a, "max_rel_l2"_a, "anchor"_a, "seed"_a)
      .def("dense", &Policy::dense, "step"_a, "layer"_a)
      .def(
          "route",
          [](Policy& policy, InputArray q, InputArray k, InputArray v, const BitViews& bit_views,
             OptionalDescale q_descale, OptionalDescale k_descale, OptionalDescale v_descale, const VideoGrid& grid,
             std::int64_t step, std::int64_t layer, float scale, std::uintptr_t stream, const std::string& layout) {
            const Tensors t{q, k, v, std::nullopt, std::nullopt, bit_views, q_descale, k_descale, v_descale};
            const Target target = target_for("", call_placement(t), stream);
            const RoutedCall call = routed_call(t, grid, layout, scale);
            const Router router(policy.options().router);
            return decisions_dict(without_gil([&] {
              return policy.decide(step, layer, call.layout, [&](std::span<const std::int64_t> heads) {
                return route_on(target, router, call, heads);
              });
            }));
          },
          STSA_ROUTING_ARGS, "grid"_a, "step"_a, "layer"_a, "scale"_a, "stream"_a, "layout"_a)
      .def_prop_ro("cached_count", &Policy::cached_count)
      .def("clear", &Policy::clear)
      .def(
          "attention",
          [](Policy& policy, InputArray q, InputArray k, InputArray v, OutputArray out, std::optional<OutputArray> lse,
             const BitViews& bit_views, OptionalDescale q_descale, OptionalDescale k_descale,
             OptionalDescale v_descale, const VideoGrid& grid, std::int64_t step, std::int64_t layer, float scale,
             const std::string& backend, std::uintptr_t stream, std::int32_t tile_q, std::int32_t tile_k,
             const std::string& align, const std::string& layout, bool timed) {
            const Tensors t{q, k, v, out, lse, bit_views, q_descale, k_descale, v_descale};
            const Target target = target_for(backend, call_placement(t), stream);
            const RoutedCall call = routed_call(t, grid, layout, scale);
            const RoutedOptions options = routed_options(tile_q, tile_k, align, timed);
            return result_dict(
                without_gil([&] { return run_policy(target, plan_cache(), policy, call, step, layer, options); }));
          },
          STSA_TENSOR_ARGS, "grid"_a, "step"_a, "layer"_a, "scale"_a, "backend"_a, "stream"_a, "tile_q"_a, "tile_k"_a,
          "align"_a, "layout"_a, "timed"_a);

  // A plan's statistics, or (lists) the plan itself as arrays.
  m.def(
      "plan",
      [](const VideoGrid& grid, const std::string& mask, double density, bool anchor, std::int32_t tile_q,
         std::int32_t tile_k, const std::string& align, bool lists) {
        const auto plan = plan_of(grid, mask, density, anchor, tile_q, tile_k, align);
        return lists ? tile_lists(*plan) : plan_dict(*plan);
      },
      "grid"_a, "mask"_a, "density"_a, "anchor"_a, "tile_q"_a, "tile_k"_a, "align"_a, "lists"_a);
  // The FLOPs of an attention call with given masks (one for every head or one per head):
  // "kept" (the masks' pairs), "kept_tiles" (what the tiles compute) and "dense", as flops.hpp counts them.
  m.def(
      "attention_flops",
      [](const VideoGrid& grid, const std::vector<std::string>& masks, double density, bool anchor,
         std::int64_t batch, std::int64_t heads, std::int64_t head_dim, std::int32_t tile_q, std::int32_t tile_k,
         const std::string& align) {
        const VideoLayout layout{grid, batch, heads, head_dim};
        layout.validate();
        check_mask_count(masks, heads);
        const VideoLayout one_head{grid, batch, 1, head_dim};
        // Per mask given, not per head: one mask for all heads counts once, times the heads (a
        // loop over 2^40 heads took hours, with the GIL held).
        const double heads_per_mask = masks.size() == 1 ? double(heads) : 1.0;
        double kept = 0, kept_tiles = 0;
        for (const std::string& mask : masks) {
          const auto plan = plan_of(grid, mask, density, anchor, tile_q, tile_k, align);
          kept += heads_per_mask * kept_pair_flops(one_head, *plan);
          kept_tiles += heads_per_mask * kept_tile_flops(one_head, *plan);
        }
        nb::dict d;
        d["kept"] = kept;
        d["kept_tiles"] = kept_tiles;
        d["dense"] = dense_attention_flops(layout);
        return d;
      },
      "grid"_a, "masks"_a, "density"_a, "anchor"_a, "batch"_a, "heads"_a, "head_dim"_a, "tile_q"_a, "tile_k"_a,
      "align"_a);
  m.def(
      "token_order",
      [](const VideoGrid& grid, const std::string& order) {
        STSA_CHECK(order == "frame-major" || order == "spatial-major", InvalidArgument,
                   "order must be 'frame-major' or 'spatial-major', got '", order, "'");
        return token_order(grid, order == "frame-major" ? TokenOrder::FrameMajor : TokenOrder::SpatialMajor);
      },
      "grid"_a, "order"_a);

  m.def("model_presets", [] {
    nb::list presets;
    for (const ModelPreset& p : model_presets()) presets.append(preset_dict(p));
    return presets;
  });
  m.def("backends", [] {
    std::vector<std::string> names;
    for (const Backend* b : backends()) names.emplace_back(b->name());
    return names;
  });
  // The process defaults of the CPU backend and the router (stsa.set_num_threads, stsa.set_isa).
  m.def(
      "set_cpu_defaults",
      [](const std::string& isa, int threads) { set_cpu_defaults({parse_isa(isa), threads}); }, "isa"_a,
      "threads"_a);
  m.def("cpu_defaults", [] {
    const CpuOptions defaults = cpu_defaults();
    return std::make_pair(std::string(to_string(defaults.isa)), defaults.threads);
  });
  // What a host call starting now runs with: the defaults resolved through the environment and the machine.
  m.def("resolved_cpu", [] {
    return std::make_pair(std::string(to_string(resolve_isa(Isa::Auto))), resolve_threads(0));
  });
  m.def("plan_cache_size", [] { return plan_cache().size(); });
  m.def("clear_plan_cache", [] { plan_cache().clear(); });
}
